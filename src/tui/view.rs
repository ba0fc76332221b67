//! What the panes draw lives with the live engine that builds it (`live::view`); the TUI only
//! reads it.
pub use prefixscope_core::live::view::*;
