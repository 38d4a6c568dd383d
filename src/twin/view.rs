//! A shard's twin as the query language reads it, in place. Testing a WHERE clause on a twin needs a
//! few of its values (`tags.building`, `properties.reported.fw`), not the rendered document with its
//! `$metadata`, timestamps and etags: rendering every twin of a large shard made a scan cost
//! microseconds per twin. Paths into `tags` and into the members of `properties.desired` /
//! `properties.reported` are followed in the shard's own tree; any other path renders just the
//! top-level member it starts with. Either way the answer is the value the rendered document holds
//! at that path, by the same lookup rules (exact name first, then ASCII case-insensitively).

use std::borrow::Cow;

use serde_json::Value;

use crate::model::{NodeRef, TwinRef, ValueRef};
use crate::query::{lookup, Document, Num, Scalar, Seg};

pub struct TwinView<'a>(pub TwinRef<'a>);

fn key_is(seg: &Seg, name: &str) -> bool {
    matches!(seg, Seg::Key(k) if k.eq_ignore_ascii_case(name))
}

impl TwinView<'_> {
    /// The section node (`tags`, desired or reported) a path leads into and the rest of the path, when
    /// the path can be followed in the shard's own tree.
    fn in_tree<'p>(&self, path: &'p [Seg]) -> Option<(NodeRef<'_>, &'p [Seg])> {
        let twin = self.0.twin();
        match path {
            [tags, rest @ ..] if key_is(tags, "tags") && !rest.is_empty() => Some((twin.tags.root(), rest)),
            // `$metadata` and `$version` exist only in the rendered section.
            [props, section, rest @ ..]
                if key_is(props, "properties")
                    && !rest.is_empty()
                    && !matches!(&rest[0], Seg::Key(k) if k.starts_with('$')) =>
            {
                if key_is(section, "desired") {
                    Some((twin.desired.root(), rest))
                } else if key_is(section, "reported") {
                    Some((twin.reported.root(), rest))
                } else {
                    None
                }
            }
            _ => None,
        }
    }
}

impl Document for TwinView<'_> {
    fn get(&self, path: &[Seg]) -> Option<Cow<'_, Value>> {
        match (self.in_tree(path), path) {
            (Some((node, rest)), _) => match walk(node, rest)? {
                Walked::Node(n) => Some(Cow::Owned(n.to_value())),
                Walked::InArray(v) => Some(Cow::Owned(v)),
            },
            (None, [Seg::Key(first), ..]) => {
                let doc = self.0.render_members(&|name| name.eq_ignore_ascii_case(first));
                lookup(&doc, path).map(|(v, _)| Cow::Owned(v.clone()))
            }
            (None, _) => None,
        }
    }

    fn scalar(&self, path: &[Seg]) -> Option<Scalar<'_>> {
        let Some((node, rest)) = self.in_tree(path) else {
            return self.get(path).and_then(Scalar::of);
        };
        match walk(node, rest)? {
            Walked::Node(n) => match n.value() {
                ValueRef::Bool(b) => Some(Scalar::Bool(b)),
                ValueRef::Number(text) => Num::parse(text).map(Scalar::Num),
                ValueRef::String(s) => Some(Scalar::Str(Cow::Borrowed(s))),
                ValueRef::Object | ValueRef::Array(_) => None,
            },
            Walked::InArray(v) => Scalar::of(Cow::Owned(v)),
        }
    }

    fn whole(&self) -> Cow<'_, Value> {
        Cow::Owned(self.0.render())
    }
}

/// Where a path below a section node ends: at a node of the tree, or inside an array value (which
/// the tree keeps as JSON text, read when a path goes into it).
enum Walked<'a> {
    Node(NodeRef<'a>),
    InArray(Value),
}

/// Follows `path` below the object `node`, by the lookup rules of the rendered document.
fn walk<'a>(node: NodeRef<'a>, path: &[Seg]) -> Option<Walked<'a>> {
    let mut cur = node;
    for (i, seg) in path.iter().enumerate() {
        match (seg, cur.value()) {
            (Seg::Key(k), ValueRef::Object) => cur = cur.find_member(k)?,
            (_, ValueRef::Array(text)) => {
                let array: Value = serde_json::from_str(text).ok()?;
                return lookup(&array, &path[i..]).map(|(v, _)| Walked::InArray(v.clone()));
            }
            _ => return None,
        }
    }
    Some(Walked::Node(cur))
}
