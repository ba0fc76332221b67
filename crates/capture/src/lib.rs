//! prefixscope's edge to the network: the recording proxy (tokio + hyper), the recorder thread
//! that writes and fans out records, the server probes' polling and the tokenizer client. What
//! it captures becomes the core's `Record`.

// What other crates may use is what a module re-exports; the rest is this crate's own,
// so the compiler sees what is dead.
#![warn(unreachable_pub)]

pub mod http1;
pub mod poll;
pub mod proxy;
pub mod recorder;
pub mod tokenize;

// The core's modules under their names here (`prefixscope_core::record`…).
