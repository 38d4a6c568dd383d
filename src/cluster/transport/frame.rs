//! Requests and answers between nodes as length-prefixed frames on one TLS (or, in development,
//! plain TCP) connection, instead of HTTP/2 streams.
//!
//! A frame is `u32` head length, `u32` body length (both little-endian), the head, then the body. The
//! head holds the frame's id (an answer carries its request's), its kind, the answer's status, the
//! request's path and its headers (`u16` name length, name, `u32` value length, value). The server reads
//! a request's head, checks its signature, and only then reads the body, which must be exactly as long
//! as the signature says (see `listen`).
//!
//! What HTTP/2 gave and frames must give too:
//! - several requests in flight on one connection, answered in any order: by id;
//! - dead peers found without waiting for the TCP retransmission timeout: the client pings a
//!   connection it has heard nothing on for a keep-alive interval, and closes it when the interval
//!   and the keep-alive timeout pass in silence; the server closes a connection silent for three
//!   intervals;
//! - no request stuck behind a large one: a body above [`BULK_BODY`] goes on a second connection to
//!   the peer (see `peers`), so snapshots never hold up heartbeats.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::oneshot;

/// Bodies larger than this go on the peer's bulk connection.
pub const BULK_BODY: usize = 256 * 1024;
/// The largest answer head a client reads (a status and a few headers).
const MAX_ANSWER_HEAD: usize = 64 * 1024;
/// Capacity of a connection's read buffer.
pub const READ_BUFFER: usize = 64 * 1024;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Request,
    Answer,
    Ping,
    Pong,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Request => 1,
            Kind::Answer => 2,
            Kind::Ping => 3,
            Kind::Pong => 4,
        }
    }

    fn of(code: u8) -> Option<Kind> {
        Some(match code {
            1 => Kind::Request,
            2 => Kind::Answer,
            3 => Kind::Ping,
            4 => Kind::Pong,
            _ => return None,
        })
    }
}

/// A frame's head, and the length of the body that follows it.
#[derive(Debug)]
pub struct Head {
    pub id: u64,
    pub kind: Kind,
    pub status: u16,
    pub path: String,
    pub headers: HeaderMap,
    pub body_len: usize,
}

/// One whole frame, ready to write.
pub fn encode(id: u64, kind: Kind, status: u16, path: &str, headers: &HeaderMap, body: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(encoded_len(path, headers, body));
    encode_into(&mut b, id, kind, status, path, headers, body);
    b.freeze()
}

fn head_len(path: &str, headers: &HeaderMap) -> usize {
    let mut head = 8 + 1 + 2 + 2 + path.len() + 2;
    for (n, v) in headers {
        head += 2 + n.as_str().len() + 4 + v.len();
    }
    head
}

fn encoded_len(path: &str, headers: &HeaderMap, body: &[u8]) -> usize {
    8 + head_len(path, headers) + body.len()
}

/// Appends one whole frame to `b`.
fn encode_into(b: &mut impl BufMut, id: u64, kind: Kind, status: u16, path: &str, headers: &HeaderMap, body: &[u8]) {
    b.put_u32_le(head_len(path, headers) as u32);
    b.put_u32_le(body.len() as u32);
    b.put_u64_le(id);
    b.put_u8(kind.code());
    b.put_u16_le(status);
    b.put_u16_le(path.len() as u16);
    b.put_slice(path.as_bytes());
    b.put_u16_le(headers.len() as u16);
    for (n, v) in headers {
        b.put_u16_le(n.as_str().len() as u16);
        b.put_slice(n.as_str().as_bytes());
        b.put_u32_le(v.len() as u32);
        b.put_slice(v.as_bytes());
    }
    b.put_slice(body);
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad frame: {what}"))
}

fn take(b: &mut Bytes, n: usize, what: &str) -> std::io::Result<Bytes> {
    if b.remaining() < n {
        return Err(invalid(what));
    }
    Ok(b.split_to(n))
}

fn u16_of(b: &mut Bytes, what: &str) -> std::io::Result<u16> {
    Ok(take(b, 2, what)?.get_u16_le())
}

/// Decodes a head (without its two length fields); every length is checked against what is there.
pub fn decode_head(mut b: Bytes, body_len: usize) -> std::io::Result<Head> {
    let id = take(&mut b, 8, "id")?.get_u64_le();
    let kind = Kind::of(take(&mut b, 1, "kind")?.get_u8()).ok_or_else(|| invalid("kind"))?;
    let status = u16_of(&mut b, "status")?;
    let path_len = u16_of(&mut b, "path length")? as usize;
    let path = String::from_utf8(take(&mut b, path_len, "path")?.to_vec()).map_err(|_| invalid("path"))?;
    let count = u16_of(&mut b, "header count")?;
    let mut headers = HeaderMap::new();
    for _ in 0..count {
        let name_len = u16_of(&mut b, "header name length")? as usize;
        let name = take(&mut b, name_len, "header name")?;
        let value_len = take(&mut b, 4, "header value length")?.get_u32_le() as usize;
        let value = take(&mut b, value_len, "header value")?;
        let name = HeaderName::from_bytes(&name).map_err(|_| invalid("header name"))?;
        let value = HeaderValue::from_maybe_shared(value).map_err(|_| invalid("header value"))?;
        headers.append(name, value);
    }
    if b.has_remaining() {
        return Err(invalid("bytes after the headers"));
    }
    Ok(Head { id, kind, status, path, headers, body_len })
}

/// Reads the next frame's head, of at most `max_head` bytes; `Ok(None)` at a clean end of stream.
pub async fn read_head<R: AsyncRead + Unpin>(r: &mut R, max_head: usize) -> std::io::Result<Option<Head>> {
    let head_len = match r.read_u32_le().await {
        Ok(n) => n as usize,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    };
    if head_len == u32::from_le_bytes(*b"PRI ") as usize {
        return Err(invalid("an HTTP/2 preface: the peer runs an older release, which spoke HTTP/2 between nodes"));
    }
    let body_len = r.read_u32_le().await? as usize;
    if head_len > max_head {
        return Err(invalid(&format!("head of {head_len} bytes, limit {max_head}")));
    }
    let mut head = BytesMut::zeroed(head_len);
    r.read_exact(&mut head).await?;
    decode_head(head.freeze(), body_len).map(Some)
}

/// Reads a body of `len` bytes.
pub async fn read_body<R: AsyncRead + Unpin>(r: &mut R, len: usize) -> std::io::Result<Bytes> {
    let mut body = BytesMut::zeroed(len);
    r.read_exact(&mut body).await?;
    Ok(body.freeze())
}

/// Any connection the frames run on.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}
pub type BoxIo = Box<dyn Io>;

/// Writes whole frames for the tasks that share a connection, several frames in one system call
/// when several are waiting.
///
/// A task appends its frame to a queue, then takes the connection; whoever holds it writes every
/// frame queued so far with one write and one flush, and a task whose frame an earlier holder wrote
/// returns at once. Under load, the frames of many requests and answers leave in one `write`
/// instead of one each (every `write` on a socket costs the kernel's send path and the peer a
/// wake-up). Frames never interleave: they are appended whole, in the order the tasks queue them.
///
/// A write that fails, or whose task is dropped midway (a frame cut short cannot be recovered from),
/// breaks the writer: every later write fails with the first error, so the connection is closed.
#[derive(Clone)]
pub struct Writer(Arc<WriterShared>);

/// What the clones of a [`Writer`] share: the queue of frames and the connection's write half.
struct WriterShared {
    queue: Mutex<Queue>,
    io: tokio::sync::Mutex<WriteHalf<BoxIo>>,
}

#[derive(Default)]
struct Queue {
    /// Frames not yet handed to the connection.
    bytes: Vec<u8>,
    /// Frames queued since the start, and of those, the first `written` are written.
    queued: u64,
    written: u64,
    /// Why the connection can no longer be written.
    broken: Option<(std::io::ErrorKind, String)>,
}

/// A queue buffer larger than this is not kept for the next batch (a snapshot's frames would
/// otherwise pin their size for the connection's life).
const KEEP_BUFFER: usize = 256 * 1024;

impl Queue {
    fn error(&self) -> Option<std::io::Error> {
        self.broken.as_ref().map(|(kind, why)| std::io::Error::new(*kind, why.clone()))
    }
}

impl Writer {
    pub fn new(w: WriteHalf<BoxIo>) -> Writer {
        Writer(Arc::new(WriterShared { queue: Mutex::default(), io: tokio::sync::Mutex::new(w) }))
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.0.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes one frame (already encoded) and flushes it: TLS holds written bytes until then.
    pub async fn write(&self, frame: &[u8]) -> std::io::Result<()> {
        self.write_with(|b| b.extend_from_slice(frame)).await
    }

    /// Encodes a frame straight into the queue, writes and flushes it.
    pub async fn write_frame(
        &self,
        id: u64,
        kind: Kind,
        status: u16,
        path: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> std::io::Result<()> {
        self.write_with(|b| {
            b.reserve(encoded_len(path, headers, body));
            encode_into(b, id, kind, status, path, headers, body);
        })
        .await
    }

    async fn write_with(&self, append: impl FnOnce(&mut Vec<u8>)) -> std::io::Result<()> {
        let mine = {
            let mut q = self.queue();
            if let Some(e) = q.error() {
                return Err(e);
            }
            append(&mut q.bytes);
            q.queued += 1;
            q.queued
        };
        // Let the other tasks that are ready to run queue their frames first.
        tokio::task::yield_now().await;
        let mut io = self.0.io.lock().await;
        let (mut batch, upto) = {
            let mut q = self.queue();
            if q.written >= mine {
                return Ok(());
            }
            if let Some(e) = q.error() {
                return Err(e);
            }
            (std::mem::take(&mut q.bytes), q.queued)
        };
        let mut midway = Midway { queue: &self.0.queue, done: false };
        let result = async {
            io.write_all(&batch).await?;
            io.flush().await
        }
        .await;
        midway.done = true;
        let mut q = self.queue();
        match result {
            Ok(()) => {
                q.written = upto;
                if q.bytes.is_empty() && batch.capacity() <= KEEP_BUFFER {
                    batch.clear();
                    q.bytes = batch;
                }
                Ok(())
            }
            Err(e) => {
                q.broken = Some((e.kind(), e.to_string()));
                Err(e)
            }
        }
    }

    /// Writes what is queued (best effort) and shuts the connection's write side.
    pub async fn shutdown(&self) {
        let mut io = self.0.io.lock().await;
        let batch = std::mem::take(&mut self.queue().bytes);
        if !batch.is_empty() {
            let _ = io.write_all(&batch).await;
        }
        let _ = io.shutdown().await;
    }

    fn downgrade(&self) -> Weak<WriterShared> {
        Arc::downgrade(&self.0)
    }
}

/// Breaks the writer if the task writing a batch is dropped before the batch is out: part of a
/// frame may have been written, and the frames of the batch are lost.
struct Midway<'a> {
    queue: &'a Mutex<Queue>,
    done: bool,
}

impl Drop for Midway<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.queue.lock().unwrap_or_else(|e| e.into_inner()).broken =
                Some((std::io::ErrorKind::Interrupted, "a write to the connection was abandoned midway".into()));
        }
    }
}

/// Writes a server's answer to request `id`.
pub async fn write_answer(
    w: &Writer,
    id: u64,
    answer: hyper::Response<http_body_util::Full<Bytes>>,
) -> std::io::Result<()> {
    use http_body_util::BodyExt;
    let (parts, body) = answer.into_parts();
    let body = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(never) => match never {},
    };
    w.write_frame(id, Kind::Answer, parts.status.as_u16(), "", &parts.headers, &body).await
}

/// An answer: status, headers, body.
pub type Answer = (StatusCode, HeaderMap, Bytes);
type Pending = Mutex<HashMap<u64, oneshot::Sender<Answer>>>;

/// What the client end of a connection shares with its reader and keep-alive tasks.
struct Shared {
    pending: Pending,
    next: AtomicU64,
    closed: AtomicBool,
    /// When a frame last arrived.
    heard: Mutex<Instant>,
    reader: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Shared {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Answer>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails every request waiting for an answer, and stops reading.
    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.pending().clear();
        if let Some(reader) = self.reader.lock().unwrap_or_else(|e| e.into_inner()).take() {
            reader.abort();
        }
    }
}

/// The client end of a connection. Clones share it; when the last is dropped the connection closes.
#[derive(Clone)]
pub struct Sender {
    write: Writer,
    shared: Arc<Shared>,
}

impl Sender {
    /// Starts the connection's reader task (answers of at most `max_body` bytes) and its keep-alive
    /// task (`keepalive`: ping after that long without a frame, close after twice that).
    pub fn start(io: BoxIo, max_body: usize, keepalive: Duration) -> Sender {
        let (r, w) = tokio::io::split(io);
        let shared = Arc::new(Shared {
            pending: Mutex::default(),
            next: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            heard: Mutex::new(Instant::now()),
            reader: Mutex::default(),
        });
        let write = Writer::new(w);
        let reader = tokio::spawn(read_answers(r, shared.clone(), max_body));
        *shared.reader.lock().unwrap_or_else(|e| e.into_inner()) = Some(reader.abort_handle());
        tokio::spawn(keep_alive(write.downgrade(), shared.clone(), keepalive));
        Sender { write, shared }
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Relaxed)
    }

    /// Sends a request and waits for its answer. Cancel safe: a caller that gives up leaves no entry.
    pub async fn send(&self, path: &str, headers: &HeaderMap, body: &[u8]) -> std::io::Result<Answer> {
        let id = self.shared.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.shared.pending().insert(id, tx);
        let _forget = Forget { shared: &self.shared, id };
        if self.is_closed() {
            return Err(std::io::Error::new(std::io::ErrorKind::NotConnected, "connection closed"));
        }
        if let Err(e) = self.write.write_frame(id, Kind::Request, 0, path, headers, body).await {
            self.shared.close();
            return Err(e);
        }
        rx.await.map_err(|_| std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "connection closed"))
    }
}

/// Removes a request's entry however its caller ends.
struct Forget<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.shared.pending().remove(&self.id);
    }
}

async fn read_answers(r: ReadHalf<BoxIo>, shared: Arc<Shared>, max_body: usize) {
    let mut r = tokio::io::BufReader::with_capacity(READ_BUFFER, r);
    let why = loop {
        let head = match read_head(&mut r, MAX_ANSWER_HEAD).await {
            Ok(Some(h)) => h,
            Ok(None) => break "closed by the peer".to_string(),
            Err(e) => break e.to_string(),
        };
        if head.body_len > max_body {
            break format!("answer of {} bytes, limit {max_body}", head.body_len);
        }
        let body = match read_body(&mut r, head.body_len).await {
            Ok(b) => b,
            Err(e) => break e.to_string(),
        };
        *shared.heard.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        if head.kind != Kind::Answer {
            continue;
        }
        let Ok(status) = StatusCode::from_u16(head.status) else { break format!("status {}", head.status) };
        let waiting = shared.pending().remove(&head.id);
        if let Some(tx) = waiting {
            let _ = tx.send((status, head.headers, body));
        }
    };
    tracing::debug!("cluster connection ended: {why}");
    shared.closed.store(true, Ordering::Relaxed);
    shared.pending().clear();
}

async fn keep_alive(writer: Weak<WriterShared>, shared: Arc<Shared>, interval: Duration) {
    let ping = encode(0, Kind::Ping, 0, "", &HeaderMap::new(), &[]);
    loop {
        tokio::time::sleep(interval).await;
        // Every sender is gone: the connection is no longer used.
        let Some(w) = writer.upgrade().map(Writer) else { break };
        if shared.closed.load(Ordering::Relaxed) {
            break;
        }
        let silent = shared.heard.lock().unwrap_or_else(|e| e.into_inner()).elapsed();
        if silent >= interval * 2 {
            tracing::debug!(?silent, "cluster connection silent; closing");
            break;
        }
        if silent >= interval && w.write(&ping).await.is_err() {
            break;
        }
    }
    shared.close();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(frame: &Bytes) -> (usize, usize, Bytes) {
        let head = u32::from_le_bytes(frame[0..4].try_into().unwrap_or_default()) as usize;
        let body = u32::from_le_bytes(frame[4..8].try_into().unwrap_or_default()) as usize;
        (head, body, frame.slice(8..8 + head))
    }

    #[test]
    fn test_frame_round_trips_head_and_body() {
        let mut h = HeaderMap::new();
        h.insert("x-a", HeaderValue::from_static("one"));
        h.append("x-a", HeaderValue::from_static("two"));
        let f = encode(7, Kind::Request, 0, "/cluster/v5/raft/vote", &h, b"body");
        let (head_len, body_len, head) = split(&f);
        assert_eq!(f.len(), 8 + head_len + body_len);
        let got = decode_head(head, body_len).expect("decodes");
        assert_eq!(
            (got.id, got.kind, got.status, got.path.as_str(), got.body_len),
            (7, Kind::Request, 0, "/cluster/v5/raft/vote", 4)
        );
        assert_eq!(got.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(&f[8 + head_len..], b"body");
    }

    #[test]
    fn test_every_truncation_and_bad_field_is_an_error_not_a_panic() {
        let mut h = HeaderMap::new();
        h.insert("x-a", HeaderValue::from_static("v"));
        let f = encode(1, Kind::Answer, 200, "/p", &h, b"");
        let (head_len, _, head) = split(&f);
        for cut in 0..head_len {
            assert!(decode_head(head.slice(..cut), 0).is_err(), "cut at {cut}");
        }
        let mut extra = head.to_vec();
        extra.push(0);
        assert!(decode_head(Bytes::from(extra), 0).is_err(), "trailing bytes");
        let mut kind = head.to_vec();
        kind[8] = 9;
        assert!(decode_head(Bytes::from(kind), 0).is_err(), "unknown kind");
        // Arbitrary bytes never panic.
        let mut x = 0x9e37_79b9_u32;
        for len in 0..200usize {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            let _ = decode_head(Bytes::from(bytes), 0);
        }
    }

    /// A connection end that counts its flushes (one per batch the writer sends).
    struct Counting<W> {
        inner: W,
        flushes: Arc<AtomicU64>,
    }

    impl<W: AsyncRead + Unpin> AsyncRead for Counting<W> {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl<W: AsyncWrite + Unpin> AsyncWrite for Counting<W> {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
        }
        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            self.flushes.fetch_add(1, Ordering::Relaxed);
            std::pin::Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    #[tokio::test]
    async fn test_concurrent_frames_arrive_whole_and_share_writes() {
        let (near, far) = tokio::io::duplex(64);
        let flushes = Arc::new(AtomicU64::new(0));
        let (_, w) = tokio::io::split(Box::new(Counting { inner: near, flushes: flushes.clone() }) as BoxIo);
        let w = Writer::new(w);
        let frames = 50u64;
        let writers: Vec<_> = (1..=frames)
            .map(|id| {
                let w = w.clone();
                tokio::spawn(async move {
                    let body = vec![id as u8; 100 + id as usize];
                    w.write_frame(id, Kind::Request, 0, "/p", &HeaderMap::new(), &body).await
                })
            })
            .collect();
        let mut r = far;
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..frames {
            let head = read_head(&mut r, 1024).await.expect("reads").expect("a frame");
            let body = read_body(&mut r, head.body_len).await.expect("body");
            assert_eq!(body.len(), 100 + head.id as usize, "frame {} whole", head.id);
            assert!(body.iter().all(|&b| b == head.id as u8), "frame {} not mixed with another", head.id);
            seen.insert(head.id);
        }
        for t in writers {
            t.await.expect("joins").expect("written");
        }
        assert_eq!(seen.len() as u64, frames, "every frame once");
        let flushes = flushes.load(Ordering::Relaxed);
        assert!(flushes < frames / 2, "{flushes} flushes for {frames} frames written at once");
    }

    #[tokio::test]
    async fn test_a_write_abandoned_midway_breaks_the_writer() {
        let (near, _far) = tokio::io::duplex(64);
        let (_, w) = tokio::io::split(Box::new(near) as BoxIo);
        let w = Writer::new(w);
        // The peer reads nothing, so the frame cannot leave whole; the timeout drops the write.
        let cut = tokio::time::timeout(Duration::from_millis(50), w.write(&[7u8; 1000])).await;
        assert!(cut.is_err(), "the write could not finish");
        let next = w.write(b"next").await.expect_err("a broken writer refuses");
        assert_eq!(next.kind(), std::io::ErrorKind::Interrupted, "{next}");
    }
}
