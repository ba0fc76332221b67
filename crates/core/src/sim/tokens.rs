//! The simulated server's tokens for recorded requests: the ceiling's block model at one token a
//! block (`cache::blocks`), so the what-if, the slot replay and the ceiling compare prompts
//! alike. A prompt has exactly the server's count of tokens; where the record has the server's
//! layout, each message's tokens are where the server has them. What a slot holds once a
//! request has answered is its prompt and its reply as the next turn renders it, all but the
//! reply's last token (sampled, never evaluated): llama.cpp's `prompt + completion − 1`.

use std::borrow::Borrow;

use super::kv::Token;
use crate::cache::blocks::{Cutter, prompt_from_body};
use crate::input::recording::{observe_record, pending_request};
use crate::input::{FileReport, Format, InputOptions, ModelEvidence, choose_block_model};
use crate::normalize::Api;
use crate::record::{Record, TokenCounts};

/// Layout counts kept for requests that have only started (bounded: past it, their messages
/// are estimated).
const MAX_KNOWN_COUNTS: usize = 1 << 16;

/// The cutter of one input and what the layouts it saw said.
pub(crate) struct SimTokens {
    cutter: Cutter,
    /// Every count seen (the server's layout or a tokenizer's), by message and tool hash, and
    /// the latest layout's lead: a request that has only started is cut with them, so its
    /// prefix lands on the tokens its turn before had.
    known: TokenCounts,
}

impl SimTokens {
    /// The model of `records` (its ratio fitted on their server counts), at one token a block.
    pub(crate) fn of<B: Borrow<Record>>(records: &[B]) -> SimTokens {
        let mut evidence = ModelEvidence::default();
        for record in records {
            observe_record(record.borrow(), &mut evidence);
        }
        let options = InputOptions {
            block_size: Some(1),
            ..InputOptions::default()
        };
        let (model, _) = choose_block_model(&options, &evidence);
        SimTokens {
            cutter: Cutter::new(model),
            known: TokenCounts {
                layout: true,
                ..TokenCounts::default()
            },
        }
    }

    /// A request that has answered: its prompt and what its slot holds after it (the prompt
    /// alone when the reply is not known). `None` for what the block model cannot render.
    /// Requests are cut in the order they reached the server.
    pub(crate) fn answered(&mut self, record: &Record) -> Option<(Vec<Token>, Vec<Token>)> {
        let mut ignored = FileReport::new("", Format::Recording);
        let pending = pending_request(record, &mut ignored)?;
        self.learn(record);
        let request = pending.cut(&mut self.cutter);
        let prompt: Vec<Token> = request.blocks.iter().map(|b| b.id).collect();
        let held = if request.cached_after.is_empty() {
            // A reply the next turn cannot reuse (it began with reasoning, which clients do
            // not send back) still fills the slot: tokens no prompt will match.
            let generated = request.output_tokens.unwrap_or(0).saturating_sub(1);
            let mut held = prompt.clone();
            held.extend(
                (0..generated.min(crate::limits::MAX_PROMPT_TOKENS)).map(|i| {
                    let mut bytes = [0u8; 16];
                    bytes[..8].copy_from_slice(&record.id.to_le_bytes());
                    bytes[8..].copy_from_slice(&i.to_le_bytes());
                    xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, 4) & crate::cache::blocks::ID_MASK
                }),
            );
            held
        } else {
            request.cached_after.iter().map(|b| b.id).collect()
        };
        Some((prompt, held))
    }

    /// A request that has only started (no response, no layout of its own): its messages are
    /// counted as the layouts of earlier requests counted them, the rest estimated.
    pub(crate) fn started(&mut self, record: &Record) -> Option<Vec<Token>> {
        let api = Api::from_path(&record.request.path);
        let body = record.request.body.as_ref()?;
        // Without any counts, cut as the requests before it were (their ends anchored by the
        // server's prompt counts), so its shared prefix lands on their tokens all the same.
        let laid_out = !self.known.messages.is_empty();
        let mut prompt = prompt_from_body(api, body, laid_out.then_some(&self.known))?;
        if laid_out {
            let ratio = self.cutter.model.tokens_per_char;
            for segment in prompt.tools.iter_mut().chain(prompt.messages.iter_mut()) {
                if segment.tokens.is_none() {
                    segment.tokens = Some((segment.chars as f64 * ratio).round() as u64);
                }
            }
        }
        let cut = self.cutter.cut(&prompt, None);
        Some(cut.blocks.iter().map(|b| b.id).collect())
    }

    fn learn(&mut self, record: &Record) {
        let Some(counts) = record.tokens.as_ref() else {
            return;
        };
        if counts.layout && counts.lead.is_some() {
            self.known.lead = counts.lead;
        }
        for (known, seen) in [
            (&mut self.known.messages, &counts.messages),
            (&mut self.known.tools, &counts.tools),
        ] {
            for (hash, &count) in seen {
                if known.len() < MAX_KNOWN_COUNTS {
                    known.insert(hash.clone(), count);
                }
            }
        }
    }
}
