//! The prefixscope binary's library: what each command does (`session`), the terminal UI
//! (`tui`), and the outputs beside the core's reports (the HTML page, the Prometheus
//! exposition). The command-line parsing is in `main.rs` and `cli/`.

// What other crates may use is what a module re-exports; the rest is this crate's own,
// so the compiler sees what is dead.
#![warn(unreachable_pub)]

pub mod clock;
pub mod html_report;
pub mod metrics;
pub mod session;
pub mod tui;
