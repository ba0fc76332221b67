//! Styles. Default terminal colours only where meaning needs colour, and none at all with
//! `NO_COLOR` set (https://no-color.org).

use ratatui::style::{Color, Modifier, Style};

/// The series of the hit-rate chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Series {
    Fifo,
    Lru,
    Optimal,
    Ceiling,
    Server,
}

#[derive(Debug, Clone, Copy)]
pub struct Theme {
    pub color: bool,
}

impl Theme {
    pub fn from_env() -> Theme {
        Theme {
            color: std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }

    pub fn plain() -> Theme {
        Theme { color: false }
    }

    fn fg(&self, color: Color) -> Style {
        if self.color {
            Style::default().fg(color)
        } else {
            Style::default()
        }
    }

    pub fn title(&self) -> Style {
        Style::default().add_modifier(Modifier::BOLD)
    }

    pub fn focused_border(&self) -> Style {
        if self.color {
            Style::default().fg(Color::Cyan)
        } else {
            Style::default().add_modifier(Modifier::BOLD)
        }
    }

    pub fn border(&self) -> Style {
        Style::default()
    }

    pub fn selected(&self) -> Style {
        Style::default().add_modifier(Modifier::REVERSED)
    }

    pub fn dim(&self) -> Style {
        if self.color {
            Style::default().fg(Color::DarkGray)
        } else {
            Style::default()
        }
    }

    pub fn bad(&self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }

    pub fn warn(&self) -> Style {
        self.fg(Color::Yellow)
    }

    /// One colour per series of the hit-rate chart, so no series takes another's.
    pub fn series(&self, series: Series) -> Style {
        self.fg(match series {
            Series::Fifo => Color::Yellow,
            Series::Lru => Color::Green,
            Series::Optimal => Color::Magenta,
            Series::Ceiling => Color::Cyan,
            Series::Server => Color::Blue,
        })
    }

    /// The span of text that differs between two versions: reversed, so it shows without colour.
    pub fn changed(&self) -> Style {
        self.fg(Color::Yellow)
            .add_modifier(Modifier::REVERSED | Modifier::BOLD)
    }

    /// A turn's cell by what it lost: nothing green, under a quarter of its prompt yellow, more
    /// red, not measured dim. The glyph says the same without colour.
    pub fn loss(&self, severity: prefixscope_core::live::view::Severity) -> Style {
        use prefixscope_core::live::view::Severity;
        match severity {
            Severity::None => self.good(),
            Severity::Some => self.warn(),
            Severity::Much => self.bad(),
            Severity::Unknown => self.dim(),
        }
    }

    pub fn good(&self) -> Style {
        self.fg(Color::Green)
    }

    /// A turn's cell by observed reuse: high green, middle yellow, low red, unknown dim.
    pub fn reuse(&self, reuse: Option<f64>) -> Style {
        match reuse {
            None => self.dim(),
            Some(r) if r >= 0.8 => self.good(),
            Some(r) if r >= 0.4 => self.warn(),
            Some(_) => self.bad(),
        }
    }
}
