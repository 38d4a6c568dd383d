fn main() -> std::process::ExitCode {
    twinhub::cli::main()
}
