//! A simulated llama.cpp server and scripted agents: the demo's traffic, and an upstream with a
//! believable prefix cache for tests, with no model.
//!
//! Pure, always built: `kv` (slots, host cache, reuse), `text` (tokenizer stand-in, chat
//! rendering), `model` (deterministic replies), `whatif` (a recording replayed against `kv`), `residency` (the
//! same replay with the server's own settings: who holds each slot, checked against `cache_n`),
//! `script` (the agents' events and the check of a report against them).
//! The edges, behind `net`: `server` (HTTP), `agents` (scripted harnesses that talk to it).

pub mod kv;
pub mod model;
pub mod residency;
pub mod script;
pub mod text;
pub mod whatif;

#[cfg(feature = "net")]
pub mod agents;
#[cfg(feature = "net")]
pub mod server;
