//! Errors of the query language.
//!
//! One error type for every rejection of query *text* (lexing, parsing, semantic checks), because the
//! HTTP layer answers them all the same way (400 with the message) and clients only need to know
//! where the problem is. Continuation tokens and wire-shipped aggregate state have their own errors:
//! they are not the user's query text and carry no position.

use thiserror::Error;

/// Longest accepted query text, in characters (IoT Hub: "Query expressions can have a maximum length
/// of 8192 characters").
pub const MAX_QUERY_CHARS: usize = 8192;

/// Deepest accepted nesting of parentheses, arrays, objects, function arguments and prefix operators.
/// Bounds the parser's and the evaluator's recursion so that no input can overflow a (2 MiB tokio)
/// thread stack.
pub const MAX_NESTING: usize = 64;

/// A rejected query: where (1-based *character* offset into the query text, so it can be shown under
/// the text a user typed regardless of UTF-8 width) and why.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("syntax error at position {position}: {message}")]
pub struct QueryError {
    /// 1-based character offset; `len + 1` means "at the end of the query".
    pub position: usize,
    pub message: String,
}

impl QueryError {
    pub(crate) fn new(position: usize, message: impl Into<String>) -> QueryError {
        QueryError { position, message: message.into() }
    }
}

/// A continuation token that cannot be used: corrupt, truncated, or issued for another query.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CursorError {
    #[error("invalid continuation token: {0}")]
    Invalid(String),
    #[error("continuation token was issued for a different query")]
    OtherQuery,
}

/// Aggregate state received from another shard that does not fit this query's plan (a different
/// query, a different version, or corruption on the way).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("aggregate state does not match the query: {0}")]
pub struct MergeError(pub String);
