//! prefixscope's pure core: the recording format, normalization, analysis, cache simulation,
//! the server's prompt-cache model, input readers, export and the live engine. No network, no
//! terminal, no async runtime: the capture edge and the binary feed it and draw it.

// What other crates may use is what a module re-exports; the rest is this crate's own,
// so the compiler sees what is dead.
#![warn(unreachable_pub)]

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
pub mod input;
pub mod limits;
pub mod live;
pub mod normalize;
pub mod output_file;
pub mod pricing;
pub mod privacy;
pub mod probe;
pub mod provider;
pub mod record;
pub mod shared;
pub mod sim;
#[cfg(test)]
mod test_support;
pub mod text;
pub mod units;

/// Version of the recording format (compatible with llmp's recording format v1).
pub const RECORD_VERSION: u32 = 1;
