//! The command line: parsing it ([`cli`]) and the subcommands that are not the
//! service itself. Each is a client of the library below it and nothing
//! imports them back: `serve` is [`crate::app`], `doctor` checks a deployment,
//! `demo` shows a timeout end to end, `ctl` drives a running instance's
//! `/admin` API.

pub mod cli;
mod ctl;
mod demo;
mod doctor;

pub use cli::main;
