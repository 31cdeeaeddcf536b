//! Removes the delayed-message plugin's timers that deleted test vhosts left
//! on a broker's node (see `order_timeout_harness::delayed`). `make test`
//! runs it after the suite, whatever the suite's outcome.
//!
//! Usage: `forget-delayed PREFIX [RABBITMQCTL [ARG…]]`: timers of every vhost
//! whose name starts with PREFIX and that no longer exists, through
//! `rabbitmqctl` (default) or the command given.

use std::process::ExitCode;

use order_timeout_harness::delayed::{self, Timers};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(prefix) = args.next() else {
        eprintln!("usage: forget-delayed PREFIX [RABBITMQCTL [ARG…]]");
        return ExitCode::from(2);
    };
    let mut ctl: Vec<String> = args.collect();
    if ctl.is_empty() {
        ctl.push("rabbitmqctl".to_string());
    }
    match delayed::forget(&ctl, Timers::OfDeletedVhosts(&prefix)) {
        Ok(n) => {
            println!(
                "forget-delayed: removed {n} delayed-message timers of deleted vhosts {prefix}* ({})",
                ctl.join(" ")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("forget-delayed: {e}");
            ExitCode::FAILURE
        }
    }
}
