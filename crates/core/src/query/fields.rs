//! Which top-level members of a document a query's answer reads. A shard keeps its twins in their
//! own form and renders a matching twin as a JSON row; rendering the whole twin (`$metadata`,
//! timestamps, etags, both property sections) costs far more than a projection such as
//! `SELECT deviceId, tags.building` needs.

use super::ast::{Expr, ExprKind, Seg};

/// A set of top-level member names (matched ASCII case-insensitively, like property lookup), or
/// every member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fields {
    All,
    /// These members (as written in the query; lookups ignore ASCII case).
    Some(Vec<String>),
}

impl Fields {
    /// No member at all.
    pub fn none() -> Fields {
        Fields::Some(Vec::new())
    }

    /// Whether the member `name` of a document is read.
    pub fn wants(&self, name: &str) -> bool {
        match self {
            Fields::All => true,
            Fields::Some(names) => names.iter().any(|n| n.eq_ignore_ascii_case(name)),
        }
    }

    pub fn is_all(&self) -> bool {
        matches!(self, Fields::All)
    }

    /// Adds the members `e` reads.
    pub(crate) fn add_expr(&mut self, e: &Expr) {
        let Fields::Some(names) = self else { return };
        match &e.kind {
            ExprKind::Root => *self = Fields::All,
            ExprKind::Path(segs) => match segs.first() {
                Some(Seg::Key(k)) => {
                    if !names.iter().any(|n| n.eq_ignore_ascii_case(k)) {
                        names.push(k.clone());
                    }
                }
                // A path starting with an index (or an empty one) reads the document as a whole.
                _ => *self = Fields::All,
            },
            _ => {
                for c in e.children() {
                    self.add_expr(c);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::query::parse;

    use super::Fields;

    fn names(f: &Fields) -> Vec<String> {
        match f {
            Fields::All => vec!["*".into()],
            Fields::Some(n) => n.iter().map(|s| s.to_ascii_lowercase()).collect(),
        }
    }

    #[test]
    fn projected_members() {
        let q = parse("SELECT * FROM devices WHERE tags.building = 43").unwrap();
        assert!(q.fields_to_project().is_all());
        let q = parse("SELECT deviceId, Properties.reported.x FROM devices WHERE status = 'enabled'").unwrap();
        assert_eq!(names(&q.fields_to_project()), ["deviceid", "properties"]);
        let q = parse("SELECT d AS whole FROM devices d").unwrap();
        assert!(q.fields_to_project().is_all());
        let q = parse("SELECT LOWER(tags.a) AS a, tags.b FROM devices").unwrap();
        assert_eq!(names(&q.fields_to_project()), ["tags"]);
        let q = parse("SELECT COUNT() AS n FROM devices WHERE tags.battery < 20").unwrap();
        assert_eq!(names(&q.fields_to_project()), Vec::<String>::new());
    }

    #[test]
    fn wants_ignores_ascii_case() {
        let f = Fields::Some(vec!["Tags".into()]);
        assert!(f.wants("tags") && f.wants("TAGS") && !f.wants("properties"));
        assert!(Fields::All.wants("anything"));
        assert!(!Fields::none().wants("tags"));
    }
}
