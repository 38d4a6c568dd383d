/// mimalloc instead of glibc's allocator: the write path allocates and frees many small buffers per
/// update across threads, where glibc's arenas spent about a fifth of the server's CPU (measured in
/// benches/README.md, "write path").
///
/// The `system-allocator` feature leaves glibc's in place, for heap profilers that intercept
/// `malloc` (heaptrack, valgrind): `cargo build --release --features system-allocator`.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    no_transparent_huge_pages();
    twinhub::cli::main()
}

/// Turns transparent huge pages off for this process. A node's heap grows in small objects and gives
/// memory back as it churns; with huge pages the kernel zeroes 2 MiB for every page the allocator
/// touches again, and a partly used huge page is resident whole. Measured with the 1M-twin bulk load
/// (benches/README.md, "huge pages off, log cache, snapshots one at a time"): the same rate over the
/// whole load, a faster first half, and about 100 MB less RSS per node without them. mimalloc is built
/// not to request them (`no_thp`); this also covers kernels set to use them for every mapping
/// (`/sys/kernel/mm/transparent_hugepage/enabled` = `always`).
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}
