//! The demo: a simulated llama.cpp server with the core's prompt-cache model (`server`),
//! deterministic replies (`model`), scripted agents that talk to it (`agents`) and the events
//! they caused, to check a report against (`script`). No model needed.

pub mod agents;
pub mod model;
pub mod script;
pub mod server;

use prefixscope_capture::http1;
use prefixscope_core::{analysis, normalize, record};
