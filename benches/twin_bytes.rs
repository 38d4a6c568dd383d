//! Bytes a shard holds per twin, by allocation size: one shard's share of the `twinhub bench memory
//! --tags` fleet (62,500 twins with three tags and a 200-byte desired value, created by bulk commands
//! of 100) applied to a `ShardState`, with every allocation counted. RSS says how much a node holds;
//! this says what holds it.
//!
//! `cargo bench --bench twin_bytes [-- TWINS]`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

use twinhub::ids::TwinId;
use twinhub::model::bulk::{BulkEntry, Identity, ImportMode};
use twinhub::model::{AuthSpec, AuthType, Command, DeviceSpec, Op, ShardState, Status};
use twinhub_bench::scenarios::memory::tags_of;

/// Live bytes and blocks by requested size (sizes above the last slot share it).
struct Counting;

const SLOTS: usize = 4097;
static BYTES: AtomicIsize = AtomicIsize::new(0);
static BY_SIZE: [AtomicIsize; SLOTS] = [const { AtomicIsize::new(0) }; SLOTS];

fn count(size: usize, blocks: isize) {
    BYTES.fetch_add(size as isize * blocks, Relaxed);
    BY_SIZE[size.min(SLOTS - 1)].fetch_add(blocks, Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size(), 1);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        count(l.size(), -1);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count(l.size(), -1);
        count(new, 1);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn by_size() -> Vec<isize> {
    BY_SIZE.iter().map(|a| a.load(Relaxed)).collect()
}

fn commands(twins: usize) -> Vec<Command> {
    let key = "q83vEjRWeJCrze8SNFZ4kKvN7xI0VniQq83vEjRWeJA=";
    (0..twins.div_ceil(100))
        .map(|c| {
            let entries = (c * 100..((c + 1) * 100).min(twins))
                .map(|i| {
                    let id = twinhub_bench::targets::key_of(i);
                    let device = DeviceSpec {
                        device_id: id.clone(),
                        status: Status::Enabled,
                        status_reason: None,
                        auth: AuthSpec {
                            auth_type: AuthType::Sas,
                            primary_key: Some(key.into()),
                            secondary_key: Some(key.into()),
                            primary_thumbprint: None,
                            secondary_thumbprint: None,
                        },
                        iot_edge: false,
                    };
                    BulkEntry {
                        id: TwinId::device(id),
                        mode: ImportMode::Create,
                        identity: Some(Identity::Device(device)),
                        etag: None,
                        twin_etag: None,
                        tags_json: Some(tags_of(i).to_string()),
                        desired_json: Some(format!(r#"{{"fb":{}}}"#, twinhub_bench::value::make(0, 0, 200))),
                    }
                })
                .collect();
            Command::new(Op::Bulk { entries }, 1_700_000_000_000 + c as i64)
        })
        .collect()
}

fn report(what: &str, twins: usize, bytes: isize, before: &[isize], after: &[isize]) {
    println!("{what}: {} bytes per twin", bytes / twins as isize);
    let mut rows: Vec<(isize, usize, isize)> = (0..SLOTS)
        .map(|s| (after[s] - before[s], s))
        .filter(|(blocks, _)| *blocks > 0)
        .map(|(blocks, s)| (blocks * s as isize / twins as isize, s, blocks))
        .collect();
    rows.sort_unstable_by(|a, b| b.cmp(a));
    for (per_twin, size, blocks) in rows.into_iter().take(12) {
        println!("  {per_twin:5} B/twin in {blocks:8} blocks of {size:5} B");
    }
}

fn main() {
    let twins = std::env::args().skip(1).find_map(|a| a.parse::<usize>().ok()).unwrap_or(62_500);
    let cmds = commands(twins);
    let (b0, h0) = (BYTES.load(Relaxed), by_size());
    let mut state = ShardState::default();
    for cmd in &cmds {
        state.apply_quietly(cmd);
    }
    // Before the commands are dropped: they were allocated before the first count.
    let (b1, h1) = (BYTES.load(Relaxed), by_size());
    drop(cmds);
    report(&format!("{twins} twins applied"), twins, b1 - b0, &h0, &h1);
    let snapshot = state.encode_snapshot();
    println!("snapshot: {} bytes per twin", snapshot.len() / twins);
    drop(state);
    let (b2, h2) = (BYTES.load(Relaxed), by_size());
    let read = ShardState::decode_snapshot(&snapshot).map_err(|e| e.to_string());
    let (b3, h3) = (BYTES.load(Relaxed), by_size());
    match read {
        Ok(state) => {
            report("read back from the snapshot", twins, b3 - b2, &h2, &h3);
            drop(state);
        }
        Err(e) => eprintln!("snapshot unreadable: {e}"),
    }
}
