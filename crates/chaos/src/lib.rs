//! The chaos suite's history checker: pure functions over a recorded [`History`], no I/O.
//!
//! The runner drives concurrent HTTP and MQTT clients against a real cluster while injecting
//! faults, records every op with its client-side invoke and complete times and what the answer said,
//! and hands the history to [`check`]. Each twin is checked on its own:
//!
//! - **versions** (`versions`): acknowledged `$version`s (desired, reported, twin `version`) are unique
//!   and follow real time; no read is older than an op that completed before it started; versions never
//!   advance by more than the writes that could have applied (a write applied twice); one section
//!   version shows one document (two documents at one version are two histories: a split brain);
//! - **linearizability** (`wgl`): a Wing & Gong / Lowe search over the twin model (`model`): desired and
//!   reported maps with their versions and the twin version; every answer must match the model state
//!   at the op's linearization point;
//! - **lost writes** (`lost`): the final read reflects every acknowledged write;
//! - **pushes** (`push`): per device connection, desired pushes arrive in `$version` order, never
//!   from the future, and replayed over the connection's last GET they give the final desired.
//!
//! # Modelling choices
//!
//! - *Failed* ops (400, 404, 412…) did not apply and are left out. *Unknown* ops (timeouts, resets) and
//!   ops that never completed may have applied at any point after their call, or never: their window is
//!   open-ended and linearizing them is optional. Unanswered reads carry nothing and are dropped.
//! - A write's answer is the state right after it (the service answers the twin it just wrote). A
//!   retried command answered from the dedupe memory would show a later document; the runner should
//!   record each HTTP attempt as its own op.
//! - **If-Match.** Etags are opaque, but each answer shows an etag with its versions. An acknowledged
//!   conditional write must have applied at the desired `$version` its etag was seen with; a 412 must
//!   have been judged when the twin `version` was none of those seen with that etag. Both hold whether
//!   the etag changes on every change or (as now) only on tags/desired changes. An etag no answer
//!   showed makes the write a plain one and its 412 a no-op, as does one seen with several desired
//!   versions for an acknowledged write (the simplification of the brief, which
//!   `CheckConfig::exact_if_match = false` applies to every etag). Tags are not modelled, so a history
//!   must not contain tags-only writes.
//! - **Initial state.** Given per twin in `History::initial` (the runner creates twins fresh and should
//!   pass [`TwinState::fresh`]). Otherwise a complete `GetTwin` that finished before any write was
//!   sent; otherwise a fresh twin, which is wrong (and reports violations) for twins written before.
//! - **Final read.** The `GetTwin` marked `final_read` (the runner adds one per twin after healing), or
//!   a marked `DeviceGet`, or else the last read invoked after every write completed.
//! - **Pushes** are notifications, not requests: they are not linearized. `client` must name one MQTT
//!   connection, since ordering is promised per connection.
//!
//! # Budgets
//!
//! The search memoizes (linearized set, state) as 128-bit fingerprints. Three sound cuts keep it near
//! linear on real histories, where most answers carry versions: answered versions must already follow
//! real time; a state that leaves a pending answered op no room for the writes that must precede it is
//! dead (`slack`); and a transition to section version k must produce the document any answer showed
//! at k. Past [`CheckConfig::max_steps`] a twin is reported inconclusive rather than hanging. A
//! non-linearizable twin is shrunk (`shrink`) to the answers that contradict each other, within
//! [`CheckConfig::shrink_total_steps`].

mod check;
mod feed;
mod history;
mod lost;
mod model;
mod push;
mod report;
mod shrink;
mod slack;
mod versions;
mod wgl;

pub mod cli;
pub mod powerfs;
pub mod runner;

#[cfg(test)]
mod tests;

pub use check::{check, check_with, CheckConfig};
pub use history::{normalize_etag, History, HistoryError, Op, OpKind, Outcome, TwinState};
pub use report::{describe, Report, Violation, ViolationKind};
