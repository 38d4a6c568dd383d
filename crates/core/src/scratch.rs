//! A byte buffer each thread keeps for writing out messages whose size is not known beforehand.
//!
//! serde_json and postcard grow a fresh `Vec` from a few bytes by doubling, so writing out a kilobyte
//! costs several reallocations and copies. The write path writes several such messages per update, on
//! every replica: the twin document a write answers, the log entry, the inter-node request. Written
//! here first, each becomes one allocation of its exact size and one copy.

use std::cell::RefCell;

use serde::Serialize;

/// The largest buffer a thread keeps between uses: a rare huge message's buffer is dropped after it,
/// so that every thread does not hold the largest message it ever wrote.
pub const KEEP: usize = 64 << 10;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `write` on an empty buffer; whatever `write` wants to keep of the bytes it must copy out.
/// A call made while the thread's buffer is in use (a `Serialize` impl that writes a message of its
/// own while being written) gets a fresh buffer instead.
pub fn with_buffer<R>(write: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            let out = write(&mut buf);
            if buf.capacity() > KEEP {
                *buf = Vec::new();
            }
            out
        }
        Err(_) => write(&mut Vec::new()),
    })
}

/// `postcard::to_allocvec`, written into the thread's buffer and copied once into a vector of exactly
/// its size.
pub fn postcard_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    with_buffer(|buf| postcard::to_io(value, &mut *buf).map(|written| written.to_vec()))
}

/// How much the thread's buffer holds on to (tests).
pub fn kept_capacity() -> usize {
    SCRATCH.with(|cell| cell.try_borrow().map_or(0, |b| b.capacity()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postcard_vec_is_to_allocvec_nested_huge_or_not() {
        let small = (7u32, "twin".to_string(), vec![1u8, 2, 3]);
        assert_eq!(postcard_vec(&small).unwrap(), postcard::to_allocvec(&small).unwrap());
        let nested = with_buffer(|outer| {
            outer.extend_from_slice(b"outer");
            let inner = postcard_vec(&small).unwrap();
            assert_eq!(outer.as_slice(), b"outer", "the nested call wrote elsewhere");
            inner
        });
        assert_eq!(nested, postcard::to_allocvec(&small).unwrap());
        let huge = vec![9u8; KEEP * 2];
        let out = postcard_vec(&huge).unwrap();
        assert_eq!(out, postcard::to_allocvec(&huge).unwrap());
        assert_eq!(out.capacity(), out.len(), "copied out at its size");
        assert!(kept_capacity() <= KEEP, "kept a huge buffer");
        assert_eq!(postcard_vec(&small).unwrap(), postcard::to_allocvec(&small).unwrap());
    }
}
