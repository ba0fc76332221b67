//! The model of a llama.cpp server's prompt cache: `kv` (slots, host cache, reuse), `text`
//! (tokenizer stand-in, chat rendering), `whatif` (a recording replayed against `kv`),
//! `residency` (the same replay with the server's own settings: who holds each slot, checked
//! against `cache_n`).

pub mod kv;
pub mod residency;
pub mod text;
pub mod whatif;
