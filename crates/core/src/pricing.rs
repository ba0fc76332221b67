//! What lost tokens cost in money: on a hosted API, every token the provider re-processed
//! instead of reading from its cache was billed at the input (or cache-write) price where a hit
//! would have cost the cache-read price. A small dated table prices the common hosted models;
//! `--prices FILE` adds or replaces entries, and prices a local server's model when the user
//! names it (nothing local is priced otherwise).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::provider::Provider;

/// Prices in pico-dollars per token (dollars per million tokens × 10⁶): integers, so a
/// configuration holding them compares exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Price {
    pub input: u64,
    pub cache_read: u64,
    /// What writing a token to the cache costs (Anthropic: 1.25 × input for 5 minutes; the
    /// input price where writes cost nothing extra).
    pub cache_write: u64,
}

impl Price {
    fn per_million(input: f64, cache_read: f64, cache_write: f64) -> Price {
        let pico = |usd: f64| (usd.max(0.0) * 1e6).round() as u64;
        Price {
            input: pico(input),
            cache_read: pico(cache_read),
            cache_write: pico(cache_write),
        }
    }

    /// Dollars a lost token cost: what it was billed (written again, or read as input where
    /// nothing was cached) less what a cache hit would have cost.
    pub fn lost_per_token(&self, cause: &str) -> f64 {
        let billed = if cause == "no_cache_breakpoint" {
            self.input
        } else {
            self.cache_write
        };
        billed.saturating_sub(self.cache_read) as f64 / 1e12
    }
}

/// Where the default table's prices were read, and when.
pub const DEFAULT_SOURCE: &str = "default table 2026-12-06 (developers.openai.com/api/docs/pricing, platform.claude.com/docs/en/about-claude/pricing, api-docs.deepseek.com/quick_start/pricing)";

/// The default table: model (by name, see `matches`), input, cache read, cache write (5
/// minutes), dollars per million tokens.
const DEFAULT_PRICES: [(&str, f64, f64, f64); 21] = [
    ("gpt-4o", 2.50, 1.25, 2.50),
    ("gpt-4o-mini", 0.15, 0.075, 0.15),
    ("gpt-4.1", 2.00, 0.50, 2.00),
    ("gpt-4.1-mini", 0.40, 0.10, 0.40),
    ("gpt-4.1-nano", 0.10, 0.025, 0.10),
    ("gpt-5", 1.25, 0.125, 1.25),
    ("gpt-5-mini", 0.25, 0.025, 0.25),
    ("o3", 2.00, 0.50, 2.00),
    ("o4-mini", 1.10, 0.275, 1.10),
    ("claude-opus-4-6", 5.0, 0.50, 6.25),
    ("claude-opus-4-5", 5.0, 0.50, 6.25),
    ("claude-opus-4-1", 15.0, 1.50, 18.75),
    ("claude-opus-4", 15.0, 1.50, 18.75),
    ("claude-sonnet-4-6", 3.0, 0.30, 3.75),
    ("claude-sonnet-4-5", 3.0, 0.30, 3.75),
    ("claude-sonnet-4", 3.0, 0.30, 3.75),
    ("claude-3-5-sonnet", 3.0, 0.30, 3.75),
    ("claude-haiku-4-5", 1.0, 0.10, 1.25),
    ("claude-3-5-haiku", 0.80, 0.08, 1.00),
    ("deepseek-flash", 0.30, 0.006, 0.30),
    ("deepseek-v4-flash", 0.30, 0.006, 0.30),
];

/// A price table: the default one, with the user's entries over it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prices {
    /// The user's entries (`--prices`), first: they also price local servers' models.
    pub user: Vec<(String, Price)>,
    pub defaults: Vec<(String, Price)>,
    /// Where the prices come from, as outputs name it.
    pub source: String,
}

impl Default for Prices {
    fn default() -> Prices {
        Prices {
            user: Vec::new(),
            defaults: DEFAULT_PRICES
                .iter()
                .map(|&(model, input, read, write)| {
                    (key(model), Price::per_million(input, read, write))
                })
                .collect(),
            source: DEFAULT_SOURCE.into(),
        }
    }
}

/// The most entries a prices file may hold (a table of models, not a payload).
const MAX_ENTRIES: usize = 10_000;

impl Prices {
    /// The default table with the entries of a prices file over it: a JSON array (or an
    /// object with a `prices` array) of `{"model": "gpt-4o", "input": 2.5, "cache_read":
    /// 1.25, "cache_write": 2.5}`, dollars per million tokens; `cache_write` defaults to
    /// `input`. Errors say which entry and why.
    pub fn with_file(text: &str, name: &str) -> Result<Prices, String> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("{name}: not JSON: {e}"))?;
        let entries = value
            .as_array()
            .or_else(|| value.get("prices").and_then(Value::as_array))
            .ok_or_else(|| {
                format!("{name}: expected an array of prices (or {{\"prices\": [...]}})")
            })?;
        if entries.len() > MAX_ENTRIES {
            return Err(format!("{name}: more than {MAX_ENTRIES} prices"));
        }
        let mut prices = Prices::default();
        for (i, entry) in entries.iter().enumerate() {
            let model = entry
                .get("model")
                .and_then(Value::as_str)
                .filter(|m| !m.is_empty() && m.len() <= 256)
                .ok_or_else(|| format!("{name}: entry {i}: no \"model\" name"))?;
            let number = |field: &str| -> Result<Option<f64>, String> {
                match entry.get(field) {
                    None | Some(Value::Null) => Ok(None),
                    Some(v) => v
                        .as_f64()
                        .filter(|n| n.is_finite() && *n >= 0.0 && *n < 1e6)
                        .map(Some)
                        .ok_or_else(|| {
                            format!("{name}: entry {i} ({model}): \"{field}\" is not a price in dollars per million tokens")
                        }),
                }
            };
            let input = number("input")?
                .ok_or_else(|| format!("{name}: entry {i} ({model}): no \"input\" price"))?;
            let read = number("cache_read")?.unwrap_or(input);
            let write = number("cache_write")?.unwrap_or(input);
            prices
                .user
                .push((key(model), Price::per_million(input, read, write)));
        }
        prices.source = format!("{name}, then the {DEFAULT_SOURCE}");
        Ok(prices)
    }

    /// The price of `model` as `provider` served it: the user's entries for any server, the
    /// default table for hosted APIs only.
    pub fn of(&self, model: &str, provider: Provider) -> Option<Price> {
        let model = key(model.rsplit('/').next().unwrap_or(model));
        let best = |table: &[(String, Price)]| {
            table
                .iter()
                .filter(|(name, _)| matches(&model, name))
                .max_by_key(|(name, _)| name.len())
                .map(|(_, price)| *price)
        };
        best(&self.user).or_else(|| provider.hosted().then(|| best(&self.defaults)).flatten())
    }
}

/// Names compared with dots as dashes and in lower case (`claude-sonnet-4.6` is
/// `claude-sonnet-4-6`).
fn key(model: &str) -> String {
    model.to_ascii_lowercase().replace('.', "-")
}

/// `model` is `name` or a dated or `-latest` version of it (`gpt-4o-2024-08-06`), not another
/// model that starts alike (`gpt-4o-mini`).
fn matches(model: &str, name: &str) -> bool {
    match model.strip_prefix(name) {
        Some("") | Some("-latest") => true,
        Some(rest) => rest
            .strip_prefix('-')
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit())),
        None => false,
    }
}

/// What the lost tokens cost, where a price is known.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Money {
    /// Dollars lost: each loss's tokens × (the price billed − the cache-read price).
    pub lost_usd: f64,
    pub priced_tokens: u64,
    /// Lost tokens of models without a price (not priced, never $0).
    pub unpriced_tokens: u64,
    pub by_cause: BTreeMap<String, f64>,
    pub source: String,
}

/// The money of the rows' losses; `None` when no lost token has a price.
pub fn money<'a>(
    losses: impl IntoIterator<Item = (&'a str, Provider, &'a str, u32)>,
    prices: &Prices,
) -> Option<Money> {
    let mut money = Money {
        lost_usd: 0.0,
        priced_tokens: 0,
        unpriced_tokens: 0,
        by_cause: BTreeMap::new(),
        source: prices.source.clone(),
    };
    for (model, provider, cause, tokens) in losses {
        match prices.of(model, provider) {
            Some(price) => {
                let usd = f64::from(tokens) * price.lost_per_token(cause);
                money.lost_usd += usd;
                money.priced_tokens += u64::from(tokens);
                *money.by_cause.entry(cause.to_string()).or_default() += usd;
            }
            None => money.unpriced_tokens += u64::from(tokens),
        }
    }
    (money.priced_tokens > 0).then_some(money)
}

/// Dollars as a person reads them: `$12.40`, `$0.0123`, `<$0.0001`.
pub fn dollars(usd: f64) -> String {
    if usd >= 1.0 {
        let cents = (usd * 100.0).round() as u64;
        format!(
            "${}.{:02}",
            crate::units::thousands(cents / 100),
            cents % 100
        )
    } else if usd >= 0.0001 {
        format!("${usd:.4}")
    } else if usd > 0.0 {
        "<$0.0001".into()
    } else {
        "$0".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_by_name_and_dated_versions_not_their_siblings() {
        let prices = Prices::default();
        let of = |m: &str| prices.of(m, Provider::OpenAi).map(|p| p.input);
        assert_eq!(of("gpt-4o-2024-08-06"), Some(2_500_000));
        assert_eq!(of("gpt-4o-mini-2024-07-18"), Some(150_000));
        assert_eq!(of("gpt-4o-audio-preview"), None);
        assert_eq!(
            prices
                .of("anthropic/claude-sonnet-4.6", Provider::OpenRouter)
                .map(|p| p.cache_read),
            Some(300_000)
        );
        // A local server's model is priced only when the user names it.
        assert_eq!(prices.of("gpt-4o", Provider::Local), None);
        let mine = Prices::with_file(
            r#"[{"model": "qwen3-8b", "input": 0.1, "cache_read": 0.01}]"#,
            "p.json",
        )
        .unwrap();
        assert_eq!(
            mine.of("qwen3-8b", Provider::Local).map(|p| p.cache_write),
            Some(100_000)
        );
    }

    #[test]
    fn a_lost_token_costs_the_billed_price_less_the_read_price() {
        let sonnet = Prices::default()
            .of("claude-sonnet-4-5", Provider::Anthropic)
            .unwrap();
        // Written again at $3.75/M where a read was $0.30/M.
        assert!((sonnet.lost_per_token("cache_expired") * 1e6 - 3.45).abs() < 1e-9);
        // Never written (no breakpoint): input at $3/M.
        assert!((sonnet.lost_per_token("no_cache_breakpoint") * 1e6 - 2.70).abs() < 1e-9);
        let money = money(
            [
                (
                    "claude-sonnet-4-5",
                    Provider::Anthropic,
                    "cache_expired",
                    1_000_000,
                ),
                ("mystery", Provider::Hosted, "provider_miss", 10),
            ],
            &Prices::default(),
        )
        .unwrap();
        assert!((money.lost_usd - 3.45).abs() < 1e-9);
        assert_eq!(
            (money.priced_tokens, money.unpriced_tokens),
            (1_000_000, 10)
        );
    }

    #[test]
    fn a_bad_prices_file_says_which_entry() {
        let err = Prices::with_file(r#"[{"model": "m", "input": -1}]"#, "p.json").unwrap_err();
        assert!(err.contains("entry 0 (m)"), "{err}");
        assert!(Prices::with_file("{}", "p.json").is_err());
    }

    #[test]
    fn dollars_read_as_dollars() {
        assert_eq!(dollars(1234.5), "$1,234.50");
        assert_eq!(dollars(0.01234), "$0.0123");
        assert_eq!(dollars(0.0), "$0");
    }
}
