//! The `order-timeout` binary: parses the command line and hands over to the library.

fn main() -> std::process::ExitCode {
    order_timeout::commands::main()
}
