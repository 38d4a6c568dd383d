//! Exact merging of pending changes: two JSON merge patches (RFC 7386) become one only when applying
//! the merged patch to *any* document gives the same result as applying both in order. That is what
//! lets a busy subscriber skip intermediate states without ever losing the final one (docs/architecture.md,
//! invariant 7).
//!
//! Pure functions, no I/O: the queues in `queue.rs` decide *when* to merge, this module decides
//! *whether* a merge is exact and computes it.
//!
//! The rule for an earlier patch `M` and a later patch `P` (both objects), for each key `k` of `P`:
//! * `P[k]` object, `M[k]` object → merge recursively;
//! * `P[k]` object, `k` absent from `M` → `M[k] = P[k]`;
//! * `P[k]` object, `M[k]` null / scalar / array → **conflict**: `M` deleted or replaced `k` and `P`
//!   re-creates it as an object; one merge patch cannot say "delete, then create" (applying
//!   `{k: {x: 1}}` to a device holding `k = {y: 2}` would keep `y`);
//! * `P[k]` null / scalar / array → `M[k] = P[k]`.
//!
//! Conflicts are checked on the whole patch before anything is changed.

use serde_json::{Map, Value};

/// Why two pending changes cannot become one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// An object patch after a delete or a non-object value at `path`.
    #[error("'{0}' is re-created as an object after being deleted or set to a non-object value")]
    Recreated(String),
    /// A change body is not in the shape the model produces (never merged, to be safe).
    #[error("change body is not mergeable: {0}")]
    Shape(String),
}

/// Checks that `later` can be merged into `earlier` exactly. `path` names the position for the error.
pub fn check_patch(earlier: &Map<String, Value>, later: &Map<String, Value>, path: &str) -> Result<(), Conflict> {
    for (k, pv) in later {
        let Value::Object(pm) = pv else { continue };
        match earlier.get(k) {
            None => {}
            Some(Value::Object(mm)) => check_patch(mm, pm, &join(path, k))?,
            Some(_) => return Err(Conflict::Recreated(join(path, k))),
        }
    }
    Ok(())
}

/// Merges `later` into `earlier`. Call [`check_patch`] first: on a conflicting pair this still
/// terminates but the result is not equivalent to applying both.
pub fn merge_patch(earlier: &mut Map<String, Value>, later: &Map<String, Value>) {
    for (k, pv) in later {
        match (earlier.get_mut(k), pv) {
            (Some(Value::Object(mm)), Value::Object(pm)) => merge_patch(mm, pm),
            _ => {
                earlier.insert(k.clone(), pv.clone());
            }
        }
    }
}

/// The merge of two patches, or the conflict that forbids it; neither input changes.
#[cfg(test)]
pub fn merged_patch(earlier: &Map<String, Value>, later: &Map<String, Value>) -> Result<Map<String, Value>, Conflict> {
    check_patch(earlier, later, "")?;
    let mut m = earlier.clone();
    merge_patch(&mut m, later);
    Ok(m)
}

/// Merges the `$metadata` of a later change into the earlier one, guided by the later *patch*: own
/// `$`-members (`$lastUpdated`, `$lastUpdatedVersion`) come from the later metadata; for each patched
/// key whose later value is an object both sides recurse; otherwise the later metadata replaces the
/// subtree (or removes it when the key was deleted). Keys the later patch did not touch keep the
/// earlier metadata. This is exactly what a consumer does when it applies the two changes in order.
pub fn merge_metadata(
    earlier: &mut Map<String, Value>,
    later_patch: &Map<String, Value>,
    later_meta: &Map<String, Value>,
) {
    for (k, v) in later_meta {
        if k.starts_with('$') {
            earlier.insert(k.clone(), v.clone());
        }
    }
    for (k, pv) in later_patch {
        match (pv, later_meta.get(k)) {
            (Value::Object(pm), Some(Value::Object(lm))) => match earlier.get_mut(k) {
                Some(Value::Object(em)) => merge_metadata(em, pm, lm),
                _ => {
                    earlier.insert(k.clone(), Value::Object(lm.clone()));
                }
            },
            (_, Some(lm)) => {
                earlier.insert(k.clone(), lm.clone());
            }
            (_, None) => {
                earlier.remove(k);
            }
        }
    }
}

/// The members of a properties section that are the patch proper (not `$metadata` / `$version`).
pub fn section_patch(section: &Map<String, Value>) -> Map<String, Value> {
    section.iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

fn as_object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, Conflict> {
    v.as_object().ok_or_else(|| Conflict::Shape(format!("{what} is not an object")))
}

/// Merges two `updateTwin` change bodies (`{"version", "tags"?, "properties": {"desired"|"reported":
/// {patch, "$metadata", "$version"}}}`) into one that a consumer can apply instead of both: sections
/// merge as patches, `$metadata` follows [`merge_metadata`], `$version` and `version` are the later's.
/// Anything unexpected in the shape is a [`Conflict::Shape`]: better not to merge than to merge wrong.
pub fn merge_change_body(earlier: &Value, later: &Value) -> Result<Value, Conflict> {
    let e = as_object(earlier, "earlier body")?;
    let l = as_object(later, "later body")?;
    for k in e.keys().chain(l.keys()) {
        if !matches!(k.as_str(), "version" | "tags" | "properties") {
            return Err(Conflict::Shape(format!("unexpected member '{k}'")));
        }
    }
    // Check everything first.
    let e_tags = e.get("tags").map(|t| as_object(t, "tags")).transpose()?;
    let l_tags = l.get("tags").map(|t| as_object(t, "tags")).transpose()?;
    if let (Some(et), Some(lt)) = (e_tags, l_tags) {
        check_patch(et, lt, "tags")?;
    }
    let e_props = e.get("properties").map(|p| as_object(p, "properties")).transpose()?;
    let l_props = l.get("properties").map(|p| as_object(p, "properties")).transpose()?;
    let empty = Map::new();
    let e_props = e_props.unwrap_or(&empty);
    let l_props = l_props.unwrap_or(&empty);
    for (name, ls) in l_props {
        let ls = as_object(ls, name)?;
        if let Some(es) = e_props.get(name) {
            let es = as_object(es, name)?;
            check_patch(&section_patch(es), &section_patch(ls), name)?;
            for s in [es, ls] {
                if let Some(m) = s.get("$metadata") {
                    as_object(m, "$metadata")?;
                }
            }
        }
    }

    // Then build.
    let mut out = Map::new();
    out.insert("version".into(), l.get("version").or_else(|| e.get("version")).cloned().unwrap_or(Value::Null));
    match (e_tags, l_tags) {
        (Some(et), Some(lt)) => {
            let mut t = et.clone();
            merge_patch(&mut t, lt);
            out.insert("tags".into(), Value::Object(t));
        }
        (Some(t), None) | (None, Some(t)) => {
            out.insert("tags".into(), Value::Object(t.clone()));
        }
        (None, None) => {}
    }
    if !e_props.is_empty() || !l_props.is_empty() {
        let mut props = e_props.clone();
        for (name, ls) in l_props {
            let ls = as_object(ls, name)?;
            let merged = match e_props.get(name).map(|es| as_object(es, name)).transpose()? {
                None => ls.clone(),
                Some(es) => merge_section(es, ls),
            };
            props.insert(name.clone(), Value::Object(merged));
        }
        out.insert("properties".into(), Value::Object(props));
    }
    Ok(Value::Object(out))
}

/// One properties section of two checked bodies: patch members first, then `$metadata`, then
/// `$version`, the order IoT Hub renders.
fn merge_section(es: &Map<String, Value>, ls: &Map<String, Value>) -> Map<String, Value> {
    let lp = section_patch(ls);
    let mut out = section_patch(es);
    merge_patch(&mut out, &lp);
    let empty = Map::new();
    let e_meta = es.get("$metadata").and_then(Value::as_object);
    let l_meta = ls.get("$metadata").and_then(Value::as_object);
    if e_meta.is_some() || l_meta.is_some() {
        let mut meta = e_meta.cloned().unwrap_or_default();
        merge_metadata(&mut meta, &lp, l_meta.unwrap_or(&empty));
        out.insert("$metadata".into(), Value::Object(meta));
    }
    if let Some(v) = ls.get("$version").or_else(|| es.get("$version")) {
        out.insert("$version".into(), v.clone());
    }
    out
}

/// Applies a merge patch to a document (RFC 7386): what a device or a consumer does with a patch.
/// Used by tests to check that merging is exact, and documents the semantics merges must preserve.
#[cfg(test)]
pub fn apply_patch(doc: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (k, pv) in patch {
        match pv {
            Value::Null => {
                doc.remove(k);
            }
            Value::Object(pm) => {
                let target = doc.entry(k.clone()).or_insert_with(|| Value::Object(Map::new()));
                if !target.is_object() {
                    *target = Value::Object(Map::new());
                }
                if let Value::Object(tm) = target {
                    apply_patch(tm, pm);
                }
            }
            other => {
                doc.insert(k.clone(), other.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    /// The defining property: applying the merge equals applying both, on the given documents.
    fn assert_exact(m: Value, p: Value, docs: &[Value]) {
        let merged = merged_patch(&obj(m.clone()), &obj(p.clone())).expect("mergeable");
        for d in docs {
            let mut seq = obj(d.clone());
            apply_patch(&mut seq, &obj(m.clone()));
            apply_patch(&mut seq, &obj(p.clone()));
            let mut once = obj(d.clone());
            apply_patch(&mut once, &merged);
            assert_eq!(Value::Object(once), Value::Object(seq), "doc {d}, M {m}, P {p}");
        }
    }

    #[test]
    fn merges_disjoint_nested_and_overwritten_keys() {
        let m =
            merged_patch(&obj(json!({"a": 1, "o": {"x": 1}})), &obj(json!({"b": 2, "o": {"y": 2}, "a": 3}))).unwrap();
        assert_eq!(Value::Object(m), json!({"a": 3, "o": {"x": 1, "y": 2}, "b": 2}));
        let docs = [json!({}), json!({"o": {"z": 9}, "a": {"deep": 1}}), json!({"o": 5})];
        assert_exact(json!({"a": 1, "o": {"x": 1}}), json!({"b": 2, "o": {"y": 2}, "a": 3}), &docs);
    }

    #[test]
    fn later_null_and_scalars_replace_anything() {
        let docs = [json!({"o": {"x": 1, "y": 2}}), json!({})];
        assert_exact(json!({"o": {"x": 5}}), json!({"o": null}), &docs);
        assert_exact(json!({"o": {"x": 5}}), json!({"o": [1, 2]}), &docs);
        assert_exact(json!({"o": null}), json!({"o": "s"}), &docs);
        assert_exact(json!({"o": {"x": null}}), json!({"o": {"x": 7}}), &[json!({"o": {"x": 1}})]);
    }

    #[test]
    fn object_after_delete_or_scalar_conflicts() {
        for earlier in [json!({"o": null}), json!({"o": 5}), json!({"o": [1]}), json!({"o": "s"})] {
            let err = merged_patch(&obj(earlier.clone()), &obj(json!({"o": {"x": 1}}))).unwrap_err();
            assert_eq!(err, Conflict::Recreated("o".into()), "{earlier}");
        }
        // Nested, and reported with its path.
        let err = merged_patch(&obj(json!({"a": {"b": null}})), &obj(json!({"a": {"b": {"c": 1}}}))).unwrap_err();
        assert_eq!(err, Conflict::Recreated("a.b".into()));
        // Why it must conflict: the two orders differ on a device holding o = {y: 2}.
        let mut seq = obj(json!({"o": {"y": 2}}));
        apply_patch(&mut seq, &obj(json!({"o": null})));
        apply_patch(&mut seq, &obj(json!({"o": {"x": 1}})));
        assert_eq!(Value::Object(seq), json!({"o": {"x": 1}}));
    }

    #[test]
    fn conflict_checked_before_mutating() {
        let earlier = obj(json!({"a": 1, "o": null}));
        let later = obj(json!({"a": 2, "o": {"x": 1}}));
        assert!(check_patch(&earlier, &later, "").is_err());
        assert!(merged_patch(&earlier, &later).is_err());
        assert_eq!(Value::Object(earlier), json!({"a": 1, "o": null}));
    }

    #[test]
    fn object_patch_onto_missing_key_is_taken_whole() {
        assert_exact(json!({"a": 1}), json!({"o": {"x": {"y": 1}}}), &[json!({"o": {"z": 1}}), json!({})]);
    }

    #[test]
    fn metadata_follows_the_later_patch() {
        let mut m = obj(json!({
            "$lastUpdated": "t1", "$lastUpdatedVersion": 2,
            "a": {"$lastUpdated": "t1", "$lastUpdatedVersion": 2},
            "o": {"$lastUpdated": "t1", "$lastUpdatedVersion": 2, "x": {"$lastUpdated": "t1", "$lastUpdatedVersion": 2}},
            "gone": {"$lastUpdated": "t1", "$lastUpdatedVersion": 2}
        }));
        let later_patch = obj(json!({"o": {"y": 1}, "gone": null, "s": {"deep": 1}}));
        let later_meta = obj(json!({
            "$lastUpdated": "t2", "$lastUpdatedVersion": 3,
            "o": {"$lastUpdated": "t2", "$lastUpdatedVersion": 3, "y": {"$lastUpdated": "t2", "$lastUpdatedVersion": 3}},
            "s": {"$lastUpdated": "t2", "$lastUpdatedVersion": 3, "deep": {"$lastUpdated": "t2", "$lastUpdatedVersion": 3}}
        }));
        merge_metadata(&mut m, &later_patch, &later_meta);
        assert_eq!(
            Value::Object(m),
            json!({
                "$lastUpdated": "t2", "$lastUpdatedVersion": 3,
                "a": {"$lastUpdated": "t1", "$lastUpdatedVersion": 2},
                "o": {"$lastUpdated": "t2", "$lastUpdatedVersion": 3,
                      "x": {"$lastUpdated": "t1", "$lastUpdatedVersion": 2},
                      "y": {"$lastUpdated": "t2", "$lastUpdatedVersion": 3}},
                "s": {"$lastUpdated": "t2", "$lastUpdatedVersion": 3, "deep": {"$lastUpdated": "t2", "$lastUpdatedVersion": 3}}
            })
        );
    }

    #[test]
    fn scalar_over_object_replaces_metadata_subtree() {
        let mut m = obj(json!({"o": {"$lastUpdated": "t1", "x": {"$lastUpdated": "t1"}}}));
        merge_metadata(&mut m, &obj(json!({"o": 5})), &obj(json!({"$lastUpdated": "t2", "o": {"$lastUpdated": "t2"}})));
        assert_eq!(Value::Object(m), json!({"o": {"$lastUpdated": "t2"}, "$lastUpdated": "t2"}));
    }

    #[test]
    fn change_bodies_merge_sections_versions_and_metadata() {
        let earlier = json!({
            "version": 5,
            "tags": {"site": "a", "rm": 1},
            "properties": {"desired": {"x": 1, "$metadata": {"$lastUpdated": "t1", "$lastUpdatedVersion": 3,
                                                              "x": {"$lastUpdated": "t1", "$lastUpdatedVersion": 3}},
                                        "$version": 3}}
        });
        let later = json!({
            "version": 7,
            "tags": {"rm": null},
            "properties": {
                "desired": {"y": 2, "$metadata": {"$lastUpdated": "t2", "$lastUpdatedVersion": 4,
                                                   "y": {"$lastUpdated": "t2", "$lastUpdatedVersion": 4}},
                            "$version": 4},
                "reported": {"r": true, "$metadata": {"$lastUpdated": "t3", "r": {"$lastUpdated": "t3"}}, "$version": 9}
            }
        });
        let m = merge_change_body(&earlier, &later).unwrap();
        assert_eq!(
            m,
            json!({
                "version": 7,
                "tags": {"site": "a", "rm": null},
                "properties": {
                    "desired": {"x": 1, "y": 2,
                                "$metadata": {"$lastUpdated": "t2", "$lastUpdatedVersion": 4,
                                              "x": {"$lastUpdated": "t1", "$lastUpdatedVersion": 3},
                                              "y": {"$lastUpdated": "t2", "$lastUpdatedVersion": 4}},
                                "$version": 4},
                    "reported": {"r": true, "$metadata": {"$lastUpdated": "t3", "r": {"$lastUpdated": "t3"}}, "$version": 9}
                }
            })
        );
        // Key order within the section: patch, then $metadata, then $version.
        let keys: Vec<&String> = m["properties"]["desired"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["x", "y", "$metadata", "$version"]);
    }

    #[test]
    fn change_bodies_with_conflicts_or_odd_shapes_do_not_merge() {
        let a = json!({"version": 2, "tags": {"t": null}});
        let b = json!({"version": 3, "tags": {"t": {"x": 1}}});
        assert_eq!(merge_change_body(&a, &b), Err(Conflict::Recreated("tags.t".into())));
        let a = json!({"version": 2, "properties": {"reported": {"r": 1, "$version": 2}}});
        let b = json!({"version": 3, "properties": {"reported": {"r": {"z": 1}, "$version": 3}}});
        assert_eq!(merge_change_body(&a, &b), Err(Conflict::Recreated("reported.r".into())));
        // A full twin (replaceTwin body) is never merged as a patch.
        let full = json!({"deviceId": "d", "version": 3, "tags": {}});
        assert!(matches!(merge_change_body(&a, &full), Err(Conflict::Shape(_))));
        assert!(matches!(merge_change_body(&json!([1]), &a), Err(Conflict::Shape(_))));
        assert!(matches!(merge_change_body(&a, &json!({"version": 4, "tags": 5})), Err(Conflict::Shape(_))));
    }
}
