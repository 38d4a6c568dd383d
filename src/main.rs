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
    twinhub::cli::main()
}
