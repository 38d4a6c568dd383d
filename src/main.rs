/// mimalloc instead of glibc's allocator: the write path allocates and frees many small buffers per
/// update across threads, where glibc's arenas spent about a fifth of the server's CPU (measured in
/// benches/README.md, "write path").
///
/// mimalloc backs its large regions with transparent huge pages where the kernel offers them
/// (`/sys/kernel/mm/transparent_hugepage/enabled` = `madvise` or `always`). With 4 KiB pages 9 % of a
/// node's CPU sat in the allocator's fast path itself, where a heap's TLB misses are paid; with huge
/// pages: +8 % updates/s and 4 % less CPU per update, for about 50 MB more RSS per node, idle or
/// holding a million twins (benches/README.md, "Transparent huge pages").
/// `MIMALLOC_ALLOW_THP=0` in a node's environment turns them off for the process.
///
/// The `system-allocator` feature leaves glibc's in place, for heap profilers that intercept
/// `malloc` (heaptrack, valgrind): `cargo build --release --features system-allocator`.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    twinhub::cli::main()
}
