//! Pieces for reading JSON text without building its tree, the way serde_json's tree reads it.
//!
//! The front door's check of a twin body (`validate_text`) uses them: it must never accept what the
//! tree's reading and check refuse. Two of serde_json's private keys make its tree read an object as
//! something else when the key comes first: a number (with `arbitrary_precision`) and a raw value (with
//! `raw_value`; the string after it is read again as JSON). No SDK sends them. A reader that meets one
//! where the tree would treat it that way does not imitate the tree: it says so ([`TreeNeeded`]), and
//! its caller reads the whole text as a tree instead. (The tree twin bodies are read into, `json_tree`,
//! refuses the raw-value key wherever it stands, so a reader stops at that key in any place.)

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use serde::de::{Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The key under which serde_json (with `arbitrary_precision`) hands a number to a visitor, as a
/// one-member map holding the number's text.
pub(super) const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// The name under which serde_json takes a value's text as JSON to write (or read) verbatim: the
/// shape [`serde_json::value::RawValue`] serializes as.
pub(super) const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// What a reader made of a text.
pub(super) enum Read<T> {
    Text(T),
    /// The text holds one of serde_json's private keys where the tree reads it specially; only the
    /// tree's reading gives the tree's outcome.
    Tree,
}

/// Set by a reader that met what only the tree reads right (a private key first in an object, or
/// whatever its caller leaves to the tree); the reading then stops.
#[derive(Default)]
pub(super) struct TreeNeeded(Cell<bool>);

impl TreeNeeded {
    /// Stops the reading if `key` is one the tree reads specially: either private key first in an
    /// object, and the raw-value key anywhere (the tree refuses it wherever it stands, see `json_tree`).
    pub(super) fn unless_plain<E: serde::de::Error>(&self, key: &str, first: bool) -> Result<(), E> {
        if key == RAW_VALUE_TOKEN || (first && key == NUMBER_TOKEN) {
            return Err(self.stop());
        }
        Ok(())
    }

    /// Stops the reading, for the whole text to be read as a tree.
    pub(super) fn stop<E: serde::de::Error>(&self) -> E {
        self.0.set(true);
        E::custom("read as a tree")
    }
}

/// Reads all of `text` with `seed`; a syntax error is the tree's "malformed JSON body".
pub(super) fn read_text<'de, S: DeserializeSeed<'de>>(
    text: &'de str,
    seed: S,
    tree: &TreeNeeded,
) -> Result<Read<S::Value>, super::TwinError> {
    let mut de = serde_json::Deserializer::from_str(text);
    match seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v)) {
        Ok(v) => Ok(Read::Text(v)),
        Err(_) if tree.0.get() => Ok(Read::Tree),
        Err(e) => Err(super::TwinError::InvalidArgument(format!("malformed JSON body: {e}"))),
    }
}

/// A value read and dropped the way the tree reads it: through serde_json's nesting-bounded reading
/// (not its unbounded skip), so that a body too deep for the tree is too deep here, with the same error.
#[derive(Clone, Copy)]
pub(super) struct Skip<'f>(pub(super) &'f TreeNeeded);

impl<'de> DeserializeSeed<'de> for Skip<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

/// Drains an array, as the tree reads one (its elements are not looked at).
pub(super) fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A, tree: &TreeNeeded) -> Result<(), A::Error> {
    while seq.next_element_seed(Skip(tree))?.is_some() {}
    Ok(())
}

/// Visitor methods for every JSON value that is not an object: each gives `$v` (arrays are drained
/// with the [`TreeNeeded`] `$tree` of the visitor `$s`).
macro_rules! not_objects {
    ($v:expr, $s:ident => $tree:expr) => {
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($v)
        }

        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($v)
        }

        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($v)
        }

        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($v)
        }

        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($v)
        }

        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($v)
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            let $s = self;
            $crate::model::json_read::skip_seq(seq, $tree).map(|()| $v)
        }
    };
}
pub(super) use not_objects;

impl<'de> Visitor<'de> for Skip<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    not_objects!((), s => s.0);

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut first = true;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            self.0.unless_plain(&key, std::mem::take(&mut first))?;
            map.next_value_seed(self)?;
        }
        Ok(())
    }
}

/// An object's key, borrowed from the text unless it has escapes (serde's own `Cow<str>` always
/// copies).
#[derive(PartialEq)]
pub(super) struct Key<'de>(pub(super) Cow<'de, str>);

impl std::ops::Deref for Key<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Key<'de>, D::Error> {
        de.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Borrowed(s)))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Owned(s.to_string())))
    }
}
