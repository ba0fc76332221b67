//! The model of a llama.cpp server's prompt cache: `kv` (slots, host cache, reuse), `text`
//! (tokenizer stand-in, chat rendering), `whatif` (a recording replayed against `kv`),
//! `residency` (the same replay with the server's own settings: who holds each slot, checked
//! against `cache_n`).

pub(crate) mod kv;
pub(crate) mod residency;
pub(crate) mod text;
pub(crate) mod tokens;
pub(crate) mod whatif;

pub use kv::{KvCache, KvConfig, Served, ServedLog, ms_for};
pub use residency::{
    AGREE_SHARE, AGREE_TOKENS, Holder, Residency, agrees, residency, residency_with_starts,
};
pub use text::{VOCAB, pieces, render_chat, token_id, tokenize};
pub use whatif::{
    RecordedSettings, Replayable, TRUSTED_AGREEMENT, Totals, WhatIf, recorded_settings, what_if,
    what_if_given,
};
