//! The session layer: what each command does, as library calls, so `cli/` only parses, calls and
//! prints, and tests call the same code in-process.
//!
//! - `capture`: a bound proxy, a recorder and a runtime from a plain config (`record`, `watch`).
//! - `replay`: records and trace requests fed to the live engine from files, paced.
//! - `demo`: the simulated server, the proxy in front of it, the scripted agents and the check.
//! - `export`: what the TUI's `e` key and `prefixscope export` share, the salt file included.
//! - `headless`: one line per record for humans.
//! - `screen`: the live engine on its thread and the TUI on a terminal.
//! - `shutdown`: SIGINT, SIGTERM and SIGHUP, the one way every command stops.

pub mod capture;
pub mod demo;
pub mod export;
pub mod headless;
pub mod replay;
pub mod screen;
pub mod shutdown;

/// Why a session could not run; the CLI maps each kind to its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The arguments make no sense (exit 2).
    Usage(String),
    /// An input could not be read, a port not bound, a file not created (exit 1).
    Unreadable(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Usage(message) | Error::Unreadable(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}
