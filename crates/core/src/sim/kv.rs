//! The KV-cache model of a simulated llama-server, pure: slots each holding a token prefix,
//! slot choice by longest common prefix else least recently used, an optional host-memory
//! prompt cache (`--cache-ram`), a sliding-window model's cache (nothing reusable once a slot
//! holds more than the window), and the rule that at least one prompt token is evaluated.
//!
//! What llama.cpp does (server-context.cpp, as of the builds in `../shared/tools/llama-server`):
//! an idle slot whose cached tokens share more than `slot_prompt_similarity` (0.1) of the new
//! prompt is preferred, the longest shared prefix first; otherwise the least recently used idle
//! slot. With the host cache on, a slot's prompt is saved to host memory before the slot is given
//! a prompt it does not continue, and the cached prompt sharing the longest prefix with the new
//! one is loaded back if it beats what the slot holds.

/// A token id: the demo's tokenizer's, or a block id of the ceiling's model (below 2^53).
pub(crate) type Token = u64;

/// How far back from the end of what a slot holds a prompt may stop matching and still reuse
/// its prefix on a sliding-window model: llama.cpp keeps positions past the window (its window
/// layers hold `n_swa + n_ubatch` cells) and context checkpoints. Fitted to the real Gemma 4
/// recordings (`recordings/llmp`): every request agrees for any margin from 165 to 420 tokens.
pub(crate) const SWA_MARGIN: usize = 256;

/// llama-server's `--slot-prompt-similarity` default.
pub(crate) const SLOT_PROMPT_SIMILARITY: f64 = 0.1;

#[derive(Debug, Clone, PartialEq)]
pub struct KvConfig {
    /// `-np`: how many prompts the server keeps at once.
    pub slots: usize,
    /// `--cache-ram`: keep prompts that leave a slot in host memory and restore them.
    pub cache_ram: bool,
    /// How many tokens the host cache holds before it drops its least recently used prompts.
    pub cache_ram_tokens: usize,
    pub slot_prompt_similarity: f64,
    /// A sliding-window attention model's window, in tokens (`None`: full attention, or
    /// llama-server's `--swa-full`).
    pub swa_window: Option<usize>,
}

impl KvConfig {
    pub fn new(slots: usize, cache_ram: bool) -> KvConfig {
        KvConfig {
            slots: slots.max(1),
            cache_ram,
            cache_ram_tokens: 4_000_000,
            slot_prompt_similarity: SLOT_PROMPT_SIMILARITY,
            swa_window: None,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Held {
    tokens: Vec<Token>,
    last_used: u64,
    /// The request whose prompt this is.
    request: Option<u64>,
}

/// What serving one prompt did to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    pub slot: usize,
    /// Tokens taken from the cache (llama.cpp's `cache_n`).
    pub cache_n: usize,
    /// Tokens evaluated (llama.cpp's `prompt_n`).
    pub prompt_n: usize,
    /// The prefix came back from the host cache.
    pub restored: bool,
    /// The request whose prompt the slot held before (after a restore: the restored one's).
    pub replaced: Option<u64>,
    /// The shared prefix was there but the sliding window made it unusable: the engine
    /// re-evaluated the whole prompt.
    pub forced: bool,
}

/// What the server did for one chat request: the ground truth tests compare the analysis with.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedLog {
    /// 1, 2, … in the order the server took the requests up.
    pub number: u64,
    /// The response's `id`.
    pub response_id: String,
    pub prompt_tokens: usize,
    pub served: Served,
}

#[derive(Debug, Clone)]
pub struct KvCache {
    config: KvConfig,
    slots: Vec<Held>,
    host: Vec<Held>,
    host_tokens: usize,
    clock: u64,
}

pub(crate) fn common_prefix(a: &[Token], b: &[Token]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl KvCache {
    pub fn new(config: KvConfig) -> KvCache {
        let slots = vec![Held::default(); config.slots.max(1)];
        KvCache {
            config,
            slots,
            host: Vec::new(),
            host_tokens: 0,
            clock: 0,
        }
    }

    pub fn config(&self) -> &KvConfig {
        &self.config
    }

    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Tokens each slot holds (for `/slots`).
    pub fn slot_tokens(&self, slot: usize) -> usize {
        self.slots.get(slot).map_or(0, |s| s.tokens.len())
    }

    /// Prompts held in host memory, and their tokens.
    pub fn host_cache(&self) -> (usize, usize) {
        (self.host.len(), self.host_tokens)
    }

    /// The slot llama-server would give `prompt`, among those `idle` allows; `None` when every
    /// slot is busy.
    pub fn choose_slot(&self, prompt: &[Token], idle: impl Fn(usize) -> bool) -> Option<usize> {
        let candidates = || (0..self.slots.len()).filter(|&i| idle(i));
        if self.config.slot_prompt_similarity > 0.0 && !prompt.is_empty() {
            let best = candidates()
                .map(|i| (common_prefix(&self.slots[i].tokens, prompt), i))
                .filter(|&(shared, _)| {
                    shared > 0
                        && shared as f64 / prompt.len() as f64 > self.config.slot_prompt_similarity
                })
                // Longest shared prefix; among equals, the lower slot (llama.cpp scans in order).
                .max_by_key(|&(shared, i)| (shared, std::cmp::Reverse(i)));
            if let Some((_, slot)) = best {
                return Some(slot);
            }
        }
        // Least recently used; among equals (slots never used) the last: a real llama-server
        // with two idle slots runs its first request on slot 1 (`/slots`,
        // `tests/llama_e2e.rs`), and the 4-slot sample in `../shared` shows slot 3 used first.
        candidates().min_by_key(|&i| (self.slots[i].last_used, std::cmp::Reverse(i)))
    }

    /// Serves `prompt` (request number `request`) on `slot`: restores from the host cache when
    /// that helps, counts what is reused, and leaves the prompt in the slot.
    pub fn serve(&mut self, slot: usize, prompt: &[Token], request: u64) -> Served {
        self.clock += 1;
        let slot = slot.min(self.slots.len() - 1);
        let in_slot = common_prefix(&self.slots[slot].tokens, prompt);
        let mut replaced = self.slots[slot].request;
        let mut restored = false;
        let mut shared = in_slot;
        // What the prefix is reused from holds this many tokens (the slot, or what the host
        // cache gives back).
        let mut held = self.slots[slot].tokens.len();
        if self.config.cache_ram {
            let best = self
                .host
                .iter()
                .enumerate()
                .map(|(i, held)| (common_prefix(&held.tokens, prompt), i))
                .filter(|&(n, _)| n > in_slot)
                .max_by_key(|&(n, i)| (n, std::cmp::Reverse(i)));
            let leaving = std::mem::take(&mut self.slots[slot]);
            if let Some((n, i)) = best {
                let back = self.host.remove(i);
                self.host_tokens -= back.tokens.len();
                replaced = back.request;
                held = back.tokens.len();
                self.slots[slot] = back;
                shared = n;
                restored = true;
                self.save(leaving);
            } else if in_slot < leaving.tokens.len() {
                // The slot's prompt is about to be cut: keep it in host memory first.
                self.save(leaving);
            } else {
                self.slots[slot] = leaving;
            }
        }
        // With a sliding window, the window layers keep the last `window` positions of what
        // the slot holds, and some more (`SWA_MARGIN`): a prompt that stops matching further
        // back needs positions they no longer have, and llama.cpp re-processes the whole
        // prompt. A turn after its reply (reasoning dropped, even) reuses its prefix.
        let forced = shared > 0
            && shared + SWA_MARGIN < held
            && self.config.swa_window.is_some_and(|window| held > window);
        if forced {
            shared = 0;
        }
        // llama.cpp evaluates at least one token, to have logits to sample from.
        let cache_n = shared.min(prompt.len().saturating_sub(1));
        let held = &mut self.slots[slot];
        held.tokens.clear();
        held.tokens.extend_from_slice(prompt);
        held.last_used = self.clock;
        held.request = Some(request);
        Served {
            slot,
            cache_n,
            prompt_n: prompt.len() - cache_n,
            restored,
            replaced,
            forced,
        }
    }

    /// What `slot` holds once its request has answered: `tokens`, the prompt it served and
    /// the reply generated into it (llama.cpp keeps both; the next turn starts with them).
    pub fn hold(&mut self, slot: usize, tokens: &[Token]) {
        if let Some(held) = self.slots.get_mut(slot) {
            held.tokens.clear();
            held.tokens.extend_from_slice(tokens);
        }
    }

    fn save(&mut self, held: Held) {
        if held.tokens.is_empty() {
            return;
        }
        // A cached prompt that the new one extends adds nothing.
        let mut i = 0;
        while i < self.host.len() {
            let old = &self.host[i].tokens;
            if old.len() <= held.tokens.len() && held.tokens.starts_with(old) {
                self.host_tokens -= old.len();
                self.host.remove(i);
            } else {
                i += 1;
            }
        }
        self.host_tokens += held.tokens.len();
        self.host.push(held);
        while self.host_tokens > self.config.cache_ram_tokens && !self.host.is_empty() {
            let oldest = (0..self.host.len())
                .min_by_key(|&i| self.host[i].last_used)
                .unwrap_or(0);
            let dropped = self.host.remove(oldest);
            self.host_tokens -= dropped.tokens.len();
        }
    }
}

/// Milliseconds to evaluate `tokens` at `tokens_per_second`.
pub fn ms_for(tokens: usize, tokens_per_second: f64) -> f64 {
    if tokens_per_second > 0.0 {
        tokens as f64 * 1000.0 / tokens_per_second
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(range: std::ops::Range<Token>) -> Vec<Token> {
        range.collect()
    }

    #[test]
    fn a_continued_prompt_reuses_its_prefix_but_one_token() {
        let mut kv = KvCache::new(KvConfig::new(1, false));
        let first = kv.serve(0, &toks(0..100), 1);
        assert_eq!((first.cache_n, first.prompt_n), (0, 100));
        let longer = toks(0..150);
        let second = kv.serve(kv.choose_slot(&longer, |_| true).unwrap(), &longer, 2);
        assert_eq!((second.cache_n, second.prompt_n), (100, 50));
        // The same prompt again: everything but the last token.
        let again = kv.serve(0, &longer, 3);
        assert_eq!((again.cache_n, again.prompt_n), (149, 1));
    }

    #[test]
    fn a_sliding_window_cannot_serve_a_prefix_that_stops_well_before_the_slots_end() {
        let mut config = KvConfig::new(1, false);
        config.swa_window = Some(120);
        let mut kv = KvCache::new(config);
        kv.serve(0, &toks(0..1000), 1);
        // Continued to its end: reused as on any model.
        let second = kv.serve(0, &toks(0..1100), 2);
        assert_eq!((second.cache_n, second.forced), (1000, false));
        // The slot holds its reply too; the next prompt drops it (a thinking model's
        // reasoning): within the margin it is still reused...
        let with_reply = |prompt: Token, reply: Token| {
            let mut held = toks(0..prompt);
            held.extend(toks(9_000..9_000 + reply));
            held
        };
        let next = |prompt: Token| {
            let mut next = toks(0..prompt);
            next.extend(toks(7_000..7_100));
            next
        };
        kv.hold(0, &with_reply(1100, SWA_MARGIN as Token));
        let third = kv.serve(0, &next(1100), 3);
        assert_eq!((third.cache_n, third.forced), (1100, false));
        // ...past it, the prompt is evaluated whole.
        kv.hold(0, &with_reply(1200, SWA_MARGIN as Token + 1));
        let fourth = kv.serve(0, &next(1200), 4);
        assert_eq!(
            (fourth.cache_n, fourth.prompt_n, fourth.forced),
            (0, 1300, true)
        );
        assert_eq!(fourth.replaced, Some(3), "nothing else used the slot");
        // A prompt sharing nothing is not forced: there was nothing to reuse.
        assert!(!kv.serve(0, &toks(10_000..10_300), 5).forced);
        // A slot within the window is never forced.
        let mut small = KvCache::new(KvConfig {
            swa_window: Some(5_000),
            ..KvConfig::new(1, false)
        });
        small.serve(0, &toks(0..1000), 1);
        assert_eq!(small.serve(0, &toks(0..10), 2).cache_n, 9);
    }

    #[test]
    fn one_slot_without_host_cache_loses_to_other_conversations() {
        let mut kv = KvCache::new(KvConfig::new(1, false));
        kv.serve(0, &toks(0..100), 1);
        let other = kv.serve(0, &toks(1000..1080), 2);
        assert_eq!(other.replaced, Some(1));
        let back = kv.serve(0, &toks(0..120), 3);
        assert_eq!(back.cache_n, 0);
        assert_eq!(back.replaced, Some(2));
    }

    #[test]
    fn the_host_cache_restores_a_conversation() {
        let mut kv = KvCache::new(KvConfig::new(1, true));
        kv.serve(0, &toks(0..100), 1);
        kv.serve(0, &toks(1000..1080), 2);
        assert_eq!(kv.host_cache(), (1, 100));
        let back = kv.serve(0, &toks(0..120), 3);
        assert!(back.restored);
        assert_eq!((back.cache_n, back.replaced), (100, Some(1)));
        // The other conversation went to host memory in its turn.
        let other = kv.serve(0, &toks(1000..1100), 4);
        assert_eq!(other.cache_n, 80);
    }

    #[test]
    fn the_host_cache_drops_least_recently_used_prompts() {
        let mut config = KvConfig::new(1, true);
        config.cache_ram_tokens = 150;
        let mut kv = KvCache::new(config);
        kv.serve(0, &toks(0..100), 1);
        kv.serve(0, &toks(1000..1100), 2);
        kv.serve(0, &toks(2000..2100), 3);
        // 1's prompt was pushed out by 2's.
        assert_eq!(kv.host_cache(), (1, 100));
        assert_eq!(kv.serve(0, &toks(0..110), 4).cache_n, 0);
    }

    #[test]
    fn slots_are_chosen_by_shared_prefix_then_least_recently_used() {
        let mut kv = KvCache::new(KvConfig::new(3, false));
        let a = toks(0..100);
        let b = toks(500..600);
        // Never-used slots tie: the last goes first, as on the real server.
        assert_eq!(kv.choose_slot(&a, |_| true), Some(2));
        kv.serve(2, &a, 1);
        assert_eq!(kv.choose_slot(&b, |_| true), Some(1));
        kv.serve(1, &b, 2);
        let a2 = toks(0..130);
        assert_eq!(kv.choose_slot(&a2, |_| true), Some(2));
        // Busy slots are skipped; a prompt sharing little goes to the least recently used.
        assert_eq!(kv.choose_slot(&a2, |i| i != 2), Some(0));
        let mostly_new: Vec<Token> = [0].into_iter().chain(5000..5100).collect();
        assert_eq!(kv.choose_slot(&mostly_new, |_| true), Some(0));
        assert_eq!(kv.choose_slot(&a2, |_| false), None);
    }
}
