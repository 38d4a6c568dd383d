//! A shard's twin as the query language reads it, in place. Testing a WHERE clause on a twin needs a
//! few of its values (`tags.building`, `properties.reported.fw`), not the rendered document with its
//! `$metadata`, timestamps and etags: rendering every twin of a large shard made a scan cost
//! microseconds per twin. Paths into `tags` and into the members of `properties.desired` /
//! `properties.reported` are followed in the shard's own tree; any other path renders just the
//! top-level member it starts with. Either way the answer is the value the rendered document holds
//! at that path, by the same lookup rules (exact name first, then ASCII case-insensitively).

use std::borrow::Cow;

use serde_json::Value;

use crate::model::{Node, NodeValue, TwinRef};
use crate::query::{lookup, Document, Seg};

pub struct TwinView<'a>(pub TwinRef<'a>);

fn key_is(seg: &Seg, name: &str) -> bool {
    matches!(seg, Seg::Key(k) if k.eq_ignore_ascii_case(name))
}

impl Document for TwinView<'_> {
    fn get(&self, path: &[Seg]) -> Option<Cow<'_, Value>> {
        let twin = self.0.twin();
        match path {
            [tags, rest @ ..] if key_is(tags, "tags") && !rest.is_empty() => in_node(&twin.tags, rest),
            // `$metadata` and `$version` exist only in the rendered section.
            [props, section, rest @ ..]
                if key_is(props, "properties")
                    && !rest.is_empty()
                    && !matches!(&rest[0], Seg::Key(k) if k.starts_with('$')) =>
            {
                if key_is(section, "desired") {
                    in_node(&twin.desired, rest)
                } else if key_is(section, "reported") {
                    in_node(&twin.reported, rest)
                } else {
                    None
                }
            }
            [Seg::Key(first), ..] => {
                let doc = self.0.render_members(&|name| name.eq_ignore_ascii_case(first));
                lookup(&doc, path).map(|(v, _)| Cow::Owned(v.clone()))
            }
            _ => None,
        }
    }

    fn whole(&self) -> Cow<'_, Value> {
        Cow::Owned(self.0.render())
    }
}

/// The value at `path` below the object `node`, as its rendering would hold it.
fn in_node<'a>(node: &'a Node, path: &[Seg]) -> Option<Cow<'a, Value>> {
    let mut cur = node;
    for (i, seg) in path.iter().enumerate() {
        match (seg, &cur.value) {
            (Seg::Key(k), NodeValue::Object(_)) => cur = cur.find_member(k)?,
            (_, NodeValue::Array(a)) => return lookup(a, &path[i..]).map(|(v, _)| Cow::Borrowed(v)),
            _ => return None,
        }
    }
    Some(Cow::Owned(cur.to_value()))
}
