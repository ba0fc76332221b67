//! The prefixscope binary's library: what each command does (`session`), the terminal UI
//! (`tui`), and the outputs beside the core's reports (the HTML page, the Prometheus
//! exposition). The command-line parsing is in `main.rs` and `cli/`.

pub mod html_report;
pub mod metrics;
pub mod session;
pub mod tui;

use prefixscope_capture::{poll, proxy, recorder, tokenize};
use prefixscope_core::{
    analysis, cache, calendar, capture, export, input, limits, live, normalize, output_file,
    privacy, probe, record, stderr_line, text, units,
};
