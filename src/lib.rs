//! prefixscope: a recording proxy in front of an LLM server, and (as it grows) the analysis of how
//! well the server's prefix cache serves that traffic.
//!
//! The core (`record`, `normalize`, `capture`) is pure: no clock, no network, no terminal. Each
//! module depends only on the floors below it: `record` (the format) on nothing, `normalize` on
//! `record`, `capture` and `analysis` on both (see DESIGN.md, "Modules"). The proxy is an edge
//! behind the `net` feature; the recorder is the one consumer that touches the disk.

/// `eprintln!` that never panics: a terminal that went away (a closed tmux, an SSH drop) turns
/// `eprintln!` into a panic, and a panic on the way out skips the shutdown that writes the
/// last records. What cannot be said is dropped.
#[macro_export]
macro_rules! stderr_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `println!` that never panics (see `stderr_line!`).
#[macro_export]
macro_rules! stdout_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub mod analysis;
pub mod cache;
pub mod calendar;
pub mod capture;
pub mod export;
pub mod growth;
#[cfg(feature = "html")]
pub mod html_report;
pub mod input;
pub mod limits;
pub mod live;
#[cfg(feature = "net")]
pub mod metrics;
pub mod normalize;
pub mod output_file;
pub mod privacy;
pub mod probe;
pub mod record;
pub mod recorder;
pub mod session;
pub mod shared;
pub mod sim;
#[cfg(test)]
mod test_support;
pub mod text;
pub mod units;

#[cfg(feature = "net")]
pub mod http1;
#[cfg(feature = "net")]
pub mod proxy;
#[cfg(feature = "net")]
pub mod tokenize;
#[cfg(feature = "tui")]
pub mod tui;

/// Version of the recording format (compatible with llmp's recording format v1).
pub const RECORD_VERSION: u32 = 1;
