//! prefixscope's edge to the network: the recording proxy (tokio + hyper), the recorder thread
//! that writes and fans out records, the server probes' polling and the tokenizer client. What
//! it captures becomes the core's `Record`.

pub mod http1;
pub mod poll;
pub mod proxy;
pub mod recorder;
pub mod tokenize;

// The core's modules under their names here (`crate::record`…).
use prefixscope_core::{
    capture, input, limits, normalize, output_file, privacy, probe, record, text, units,
};
