//! The demo: a simulated llama.cpp server with the core's prompt-cache model (`server`),
//! deterministic replies (`model`), scripted agents that talk to it (`agents`) and the events
//! they caused, to check a report against (`script`). No model needed.

// What other crates may use is what a module re-exports; the rest is this crate's own,
// so the compiler sees what is dead.
#![warn(unreachable_pub)]

pub mod agents;
pub mod model;
pub mod script;
pub mod server;
