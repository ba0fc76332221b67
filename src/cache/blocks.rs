//! The block model: a request's prompt rendered as a chat template would, cut into blocks of
//! `block_size` tokens, each block id a salted xxh3-64 chained over (parent id, block content),
//! masked below 2^53 so every JSON reader keeps it exact.
//!
//! Rendering (llmtrafficlens's layout, so figures on the same log compare): the tool
//! definitions (`<tools>` + canonical JSON), then per message `<{role}>`, `<name>{name}`,
//! `<tcid>{tool_call_id}`, the content (text parts joined), `<calls>` + the tool calls as
//! canonical JSON. Reasoning is never rendered: engines strip it before prefill. Tools lead
//! (GLM, Kimi, DeepSeek and unknown families: the conservative reading) or follow the system
//! message (Qwen, Llama, Hunyuan), by model family or an explicit choice.
//!
//! Token positions: from tokenizer counts when the recording has them for every part; else
//! characters × the input's tokens-per-character (learned over the whole input from the
//! server's `prompt_tokens`, ¼ when nothing says otherwise), and the request gets exactly
//! `ceil(prompt_tokens / block_size)` blocks weighing `prompt_tokens` in all: text past the last
//! block folds into it, blocks past the text are empty (the template's own tokens). One ratio for
//! the whole input rather than one per request keeps block boundaries where the text is: a
//! per-request ratio moves every boundary whenever two requests' ratios differ by a fraction of a
//! percent, and shared prefixes would stop matching (see DESIGN.md).
//!
//! Digest recordings keep no text: a block's id chains (parent, hash of the message its last
//! character falls in, its index among this request's blocks ending in that message).

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{Block, BlockKeys, Cut, PromptPart};
use crate::normalize::digest::{content_text, message_digest};
use crate::normalize::{Api, anthropic};
use crate::record::{RequestDigest, TokenCounts, hash};

/// Block ids stay below 2^53, the largest range of integers a JSON reader keeps exact.
pub const ID_MASK: u64 = (1 << 53) - 1;

/// Characters per token when nothing better is known.
pub const DEFAULT_TOKENS_PER_CHAR: f64 = 0.25;

const PREVIEW_CHARS: usize = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolsPosition {
    Leading,
    AfterSystem,
}

impl ToolsPosition {
    pub fn parse(text: &str) -> Option<ToolsPosition> {
        match text {
            "leading" => Some(ToolsPosition::Leading),
            "after-system" | "after_system" => Some(ToolsPosition::AfterSystem),
            _ => None,
        }
    }

    /// Qwen-, Llama- and Hunyuan-style templates put tool definitions after the system message;
    /// GLM, Kimi and DeepSeek put them first, and so do we for unknown families, because that
    /// is the lower reading (a changed tool set breaks the prefix right away).
    pub fn for_model(model: Option<&str>) -> ToolsPosition {
        let name = model.unwrap_or_default().to_ascii_lowercase();
        if ["qwen", "llama", "hunyuan", "hy3"]
            .iter()
            .any(|family| name.contains(family))
        {
            ToolsPosition::AfterSystem
        } else {
            ToolsPosition::Leading
        }
    }
}

/// One part of a prompt: the tool definitions or one message.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// `tools`, a role, or `prompt` (completions API).
    pub kind: String,
    pub label: Option<String>,
    /// The digest's hash of the part (message identity or the tools' hash).
    pub identity: u64,
    /// Rendered length in characters, markup included.
    pub chars: u64,
    /// The rendered text, when the input has it.
    pub text: Option<String>,
    /// Tokens by the recording's tokenizer, when it counted them.
    pub tokens: Option<u64>,
    /// The content's first characters, when the input has the text.
    pub preview: Option<String>,
}

/// A prompt as parts, before the tool definitions are placed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prompt {
    pub model: Option<String>,
    pub tools: Option<Segment>,
    pub messages: Vec<Segment>,
}

impl Prompt {
    pub fn chars(&self) -> u64 {
        self.tools
            .iter()
            .chain(&self.messages)
            .map(|s| s.chars)
            .sum()
    }

    pub fn has_text(&self) -> bool {
        self.messages.iter().all(|s| s.text.is_some())
    }

    fn ordered(&self, position: ToolsPosition) -> Vec<&Segment> {
        let mut out: Vec<&Segment> = Vec::with_capacity(self.messages.len() + 1);
        let after_system = position == ToolsPosition::AfterSystem
            && self.messages.first().is_some_and(|m| m.kind == "system");
        if !after_system {
            out.extend(&self.tools);
        }
        for (i, message) in self.messages.iter().enumerate() {
            out.push(message);
            if after_system && i == 0 {
                out.extend(&self.tools);
            }
        }
        out
    }
}

fn hex_to_u64(hex: &str) -> u64 {
    u64::from_str_radix(hex, 16).unwrap_or_else(|_| hash::fnv1a64(hex.as_bytes()))
}

fn str_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value
        .get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn header(role: &str, name: Option<&str>, tool_call_id: Option<&str>) -> String {
    let mut text = format!("<{role}>");
    if let Some(name) = name {
        text.push_str("<name>");
        text.push_str(name);
    }
    if let Some(id) = tool_call_id {
        text.push_str("<tcid>");
        text.push_str(id);
    }
    text
}

fn char_count(text: &str) -> u64 {
    text.chars().count() as u64
}

fn preview(text: &str) -> Option<String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return None;
    }
    let mut out: String = trimmed.chars().take(PREVIEW_CHARS).collect();
    if trimmed.chars().nth(PREVIEW_CHARS).is_some() {
        out.push('…');
    }
    Some(out)
}

fn label_of(name: Option<&str>, tool_call_id: Option<&str>) -> Option<String> {
    name.or(tool_call_id).map(str::to_string)
}

/// The prompt of a request body with its text (full recordings, gateway logs). `None` when the
/// body holds no prompt this model understands.
pub fn prompt_from_body(api: Api, body: &Value, counts: Option<&TokenCounts>) -> Option<Prompt> {
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_string);
    if api == Api::OpenaiCompletions {
        let text = body.get("prompt").and_then(Value::as_str)?.to_string();
        return Some(Prompt {
            model,
            tools: None,
            messages: vec![Segment {
                kind: "prompt".into(),
                label: None,
                identity: hash::fnv1a64(text.as_bytes()),
                chars: char_count(&text),
                tokens: None,
                preview: preview(&text),
                text: Some(text),
            }],
        });
    }
    let (messages, tools): (Vec<Value>, Vec<Value>) = if api == Api::AnthropicMessages {
        body.get("messages")?.as_array()?;
        (anthropic::chat_messages(body), anthropic::chat_tools(body))
    } else {
        let messages = body.get("messages")?.as_array()?.clone();
        let tools = body
            .get("tools")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        (messages, tools)
    };
    let tools_segment = (!tools.is_empty()).then(|| {
        let names: Vec<&str> = tools.iter().filter_map(tool_name).collect();
        let array = Value::Array(tools.clone());
        let text = format!("<tools>{}", hash::canonical_json(&array));
        let identity = hash::hex_value(&array);
        let tokens = counts.and_then(|c| {
            tools
                .iter()
                .map(|t| c.tools.get(&hash::hex_value(t)).map(|&n| u64::from(n)))
                .sum::<Option<u64>>()
        });
        Segment {
            kind: "tools".into(),
            label: Some(names.join(", ")),
            identity: hex_to_u64(&identity),
            chars: char_count(&text),
            text: Some(text),
            tokens,
            preview: None,
        }
    });
    let segments = messages
        .iter()
        .filter(|m| m.is_object())
        .map(|message| {
            let role = str_field(message, "role").unwrap_or_default();
            let name = str_field(message, "name").or_else(|| str_field(message, "tool_name"));
            let tool_call_id = str_field(message, "tool_call_id");
            let content = content_text(message.get("content"));
            let mut text = header(role, name, tool_call_id);
            text.push_str(&content);
            if let Some(calls) = message
                .get("tool_calls")
                .filter(|c| c.as_array().is_some_and(|a| !a.is_empty()))
            {
                text.push_str("<calls>");
                text.push_str(&hash::canonical_json(calls));
            }
            let identity = message_digest(message).hash;
            let tokens = counts
                .and_then(|c| c.messages.get(&identity))
                .map(|&n| u64::from(n));
            Segment {
                kind: role.to_string(),
                label: label_of(name, tool_call_id),
                identity: hex_to_u64(&identity),
                chars: char_count(&text),
                text: Some(text),
                tokens,
                preview: preview(&content),
            }
        })
        .collect();
    Some(Prompt {
        model,
        tools: tools_segment,
        messages: segments,
    })
}

fn tool_name(tool: &Value) -> Option<&str> {
    tool.pointer("/function/name")
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
}

/// The prompt of a digest recording: sizes and hashes, no text. Character counts equal the
/// full rendering's, so a full and a digest recording of the same traffic place their blocks
/// at the same token positions.
pub fn prompt_from_digest(digest: &RequestDigest, counts: Option<&TokenCounts>) -> Prompt {
    let tools = (!digest.tools.is_empty()).then(|| {
        let json_chars: u64 = digest.tools.iter().map(|t| u64::from(t.chars)).sum::<u64>()
            + digest.tools.len() as u64
            + 1;
        let tokens = counts.and_then(|c| {
            digest
                .tools
                .iter()
                .map(|t| c.tools.get(&t.hash).map(|&n| u64::from(n)))
                .sum::<Option<u64>>()
        });
        Segment {
            kind: "tools".into(),
            label: Some(
                digest
                    .tools
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            identity: digest.tools_hash.as_deref().map_or(0, hex_to_u64),
            chars: "<tools>".len() as u64 + json_chars,
            text: None,
            tokens,
            preview: None,
        }
    });
    let messages = digest
        .messages
        .iter()
        .map(|m| {
            let header = header(&m.role, m.name.as_deref(), m.tool_call_id.as_deref());
            let calls_marker = if m.tool_calls.is_empty() {
                0
            } else {
                "<calls>".len() as u64
            };
            Segment {
                kind: m.role.clone(),
                label: label_of(m.name.as_deref(), m.tool_call_id.as_deref()),
                identity: hex_to_u64(&m.hash),
                chars: char_count(&header) + u64::from(m.chars) + calls_marker,
                text: None,
                tokens: counts
                    .and_then(|c| c.messages.get(&m.hash))
                    .map(|&n| u64::from(n)),
                preview: None,
            }
        })
        .collect();
    Prompt {
        model: digest.model.clone(),
        tools,
        messages,
    }
}

/// Tokens per character over every prompt whose server count is known; the default when none.
pub fn tokens_per_char(prompts: impl IntoIterator<Item = (u64, Option<u64>)>) -> f64 {
    let (mut chars, mut tokens) = (0u64, 0u64);
    for (c, t) in prompts {
        if let Some(t) = t {
            chars += c;
            tokens += t;
        }
    }
    if chars == 0 || tokens == 0 {
        DEFAULT_TOKENS_PER_CHAR
    } else {
        // Bounded, so a file's counts can never make an estimate past what text can hold.
        (tokens as f64 / chars as f64).min(crate::limits::MAX_TOKENS_PER_CHAR)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BlockModel {
    pub block_size: u32,
    pub salt: u64,
    /// `None`: by model family.
    pub tools_position: Option<ToolsPosition>,
    pub tokens_per_char: f64,
    /// Key blocks by message digest even when the text is there (to compare with digests).
    pub keys_from_messages: bool,
}

impl Default for BlockModel {
    fn default() -> Self {
        BlockModel {
            block_size: 16,
            salt: 0,
            tools_position: None,
            tokens_per_char: DEFAULT_TOKENS_PER_CHAR,
            keys_from_messages: false,
        }
    }
}

/// A prompt cut into blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct CutPrompt {
    pub blocks: Vec<Block>,
    pub input_tokens: u64,
    pub cut: Cut,
    pub keys: BlockKeys,
    pub parts: Vec<PromptPart>,
}

impl BlockModel {
    fn chain(&self, parent: u64, payload: &[u8]) -> u64 {
        let mut bytes = Vec::with_capacity(8 + payload.len());
        bytes.extend_from_slice(&parent.to_le_bytes());
        bytes.extend_from_slice(payload);
        xxh3_64_with_seed(&bytes, self.salt) & ID_MASK
    }

    /// Cuts `prompt` into blocks. `prompt_tokens` is the server's count, when it gave one.
    pub fn cut(&self, prompt: &Prompt, prompt_tokens: Option<u64>) -> CutPrompt {
        let position = self
            .tools_position
            .unwrap_or_else(|| ToolsPosition::for_model(prompt.model.as_deref()));
        let segments = prompt.ordered(position);
        let total_chars: u64 = segments.iter().map(|s| s.chars).sum();
        let counted = !segments.is_empty() && segments.iter().all(|s| s.tokens.is_some());

        // Token position where each segment ends (piecewise linear in characters).
        let mut token_ends = Vec::with_capacity(segments.len());
        let mut running = 0f64;
        for segment in &segments {
            running += match (counted, segment.tokens) {
                (true, Some(tokens)) => tokens as f64,
                _ => segment.chars as f64 * self.tokens_per_char,
            };
            token_ends.push(running);
        }
        let (cut, total_tokens) = match (counted, prompt_tokens) {
            (true, prompt_tokens) => (
                Cut::TokenizerCounts,
                prompt_tokens.unwrap_or(running.ceil() as u64),
            ),
            (false, Some(tokens)) => (Cut::ServerPromptTokens, tokens),
            (false, None) => (Cut::CharsDiv4, running.ceil() as u64),
        };
        // The callers refuse implausible counts (and say so); this bound makes sure no count,
        // however it got here, sizes more blocks than the prompt's text can fill.
        let total_tokens = total_tokens.min(crate::limits::max_tokens_for_chars(total_chars));
        let block_size = u64::from(self.block_size.max(1));
        let block_count = total_tokens.div_ceil(block_size);

        // Character offset of a token position.
        let char_at = |token: f64| -> u64 {
            let mut start_token = 0f64;
            let mut start_char = 0u64;
            for (segment, &end_token) in segments.iter().zip(&token_ends) {
                if token < end_token {
                    let span = end_token - start_token;
                    let within = if span > 0.0 {
                        ((token - start_token) / span * segment.chars as f64).floor() as u64
                    } else {
                        0
                    };
                    return start_char + within.min(segment.chars);
                }
                start_token = end_token;
                start_char += segment.chars;
            }
            total_chars
        };
        let mut ends = Vec::with_capacity(block_count as usize);
        for k in 0..block_count {
            ends.push(if k + 1 == block_count {
                total_chars
            } else {
                char_at(((k + 1) * block_size) as f64).min(total_chars)
            });
        }

        let use_text = !self.keys_from_messages && segments.iter().all(|s| s.text.is_some());
        let keys = if use_text {
            BlockKeys::Content
        } else {
            BlockKeys::MessageDigest
        };
        let ids = if use_text {
            self.content_ids(&segments, &ends)
        } else {
            self.digest_ids(&segments, &ends)
        };
        let blocks = ids
            .into_iter()
            .enumerate()
            .map(|(k, id)| Block {
                id,
                tokens: (total_tokens - k as u64 * block_size).min(block_size) as u32,
            })
            .collect();

        let scale = if running > 0.0 && cut != Cut::TokenizerCounts {
            total_tokens as f64 / running
        } else {
            1.0
        };
        let parts = segments
            .iter()
            .zip(&token_ends)
            .map(|(segment, &end)| PromptPart {
                kind: segment.kind.clone(),
                label: segment.label.clone(),
                token_end: ((end * scale).round() as u64).min(total_tokens),
                preview: segment.preview.clone(),
            })
            .collect();
        CutPrompt {
            blocks,
            input_tokens: total_tokens,
            cut,
            keys,
            parts,
        }
    }

    fn content_ids(&self, segments: &[&Segment], ends: &[u64]) -> Vec<u64> {
        let text: String = segments.iter().filter_map(|s| s.text.as_deref()).collect();
        // Byte offset of each block end, found in one pass over the characters.
        let mut byte_ends = Vec::with_capacity(ends.len());
        let mut chars = text
            .char_indices()
            .map(|(i, _)| i)
            .chain(std::iter::once(text.len()));
        let mut char_index = 0u64;
        let mut byte = chars.next().unwrap_or(0);
        for &end in ends {
            while char_index < end {
                byte = chars.next().unwrap_or(text.len());
                char_index += 1;
            }
            byte_ends.push(byte);
        }
        let mut parent = 0u64;
        let mut start = 0usize;
        let mut ids = Vec::with_capacity(ends.len());
        for end in byte_ends {
            parent = self.chain(parent, &text.as_bytes()[start..end.max(start)]);
            ids.push(parent);
            start = end.max(start);
        }
        ids
    }

    fn digest_ids(&self, segments: &[&Segment], ends: &[u64]) -> Vec<u64> {
        let mut segment_ends = Vec::with_capacity(segments.len());
        let mut running = 0u64;
        for s in segments {
            running += s.chars;
            segment_ends.push(running);
        }
        let mut parent = 0u64;
        let mut start = 0u64;
        let mut last_segment = usize::MAX;
        let mut index_within = 0u32;
        let mut ids = Vec::with_capacity(ends.len());
        for &end in ends {
            // The segment holding the block's last character; an empty block (template tokens
            // past the text) belongs to none.
            let segment = if end > start {
                segment_ends
                    .iter()
                    .position(|&e| e >= end)
                    .unwrap_or(segments.len())
            } else {
                segments.len()
            };
            if segment == last_segment {
                index_within += 1;
            } else {
                last_segment = segment;
                index_within = 0;
            }
            let identity = segments.get(segment).map_or(0, |s| s.identity);
            let mut payload = [0u8; 12];
            payload[..8].copy_from_slice(&identity.to_le_bytes());
            payload[8..].copy_from_slice(&index_within.to_le_bytes());
            parent = self.chain(parent, &payload);
            ids.push(parent);
            start = end.max(start);
        }
        ids
    }
}

/// The prompt body a request carries (full mode), for the APIs the block model renders.
pub fn renders(api: Api) -> bool {
    api.is_chat() || api == Api::OpenaiCompletions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::digest::request_digest;
    use serde_json::json;

    fn body() -> Value {
        json!({"model": "m", "tools": [{"type": "function", "function": {"name": "ls", "parameters": {}}}],
            "messages": [
                {"role": "system", "content": "You are terse. ".repeat(20)},
                {"role": "user", "content": "List the files."},
                {"role": "assistant", "content": null, "reasoning_content": "I should call ls.",
                 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.rs b.rs"}]})
    }

    #[test]
    fn rendering_includes_tools_roles_calls_and_ids_but_not_reasoning() {
        let prompt = prompt_from_body(Api::OpenaiChat, &body(), None).unwrap_or_default();
        let texts: Vec<&str> = prompt
            .messages
            .iter()
            .filter_map(|s| s.text.as_deref())
            .collect();
        assert!(texts[2].starts_with("<assistant><calls>[{"));
        assert!(!texts.concat().contains("I should call ls"));
        assert_eq!(texts[3], "<tool><tcid>c1a.rs b.rs");
        assert!(prompt.tools.as_ref().is_some_and(|t| {
            t.text
                .as_deref()
                .is_some_and(|x| x.starts_with("<tools>[{"))
        }));
    }

    #[test]
    fn digest_and_full_have_the_same_sizes() {
        let full = prompt_from_body(Api::OpenaiChat, &body(), None).unwrap_or_default();
        let digest = request_digest(Api::OpenaiChat, &body()).map(|d| prompt_from_digest(&d, None));
        let digest = digest.unwrap_or_default();
        let sizes = |p: &Prompt| {
            p.tools
                .iter()
                .chain(&p.messages)
                .map(|s| (s.chars, s.identity))
                .collect::<Vec<_>>()
        };
        assert_eq!(sizes(&full), sizes(&digest));
    }

    #[test]
    fn server_prompt_tokens_fix_the_block_count_and_weights() {
        let prompt = prompt_from_body(Api::OpenaiChat, &body(), None).unwrap_or_default();
        let model = BlockModel::default();
        for tokens in [1u64, 15, 16, 17, 100, 1000] {
            let cut = model.cut(&prompt, Some(tokens));
            assert_eq!(cut.cut, Cut::ServerPromptTokens);
            assert_eq!(cut.blocks.len() as u64, tokens.div_ceil(16));
            assert_eq!(
                cut.blocks.iter().map(|b| u64::from(b.tokens)).sum::<u64>(),
                tokens
            );
            assert!(cut.blocks.iter().all(|b| b.id <= ID_MASK));
        }
        let estimated = model.cut(&prompt, None);
        assert_eq!(estimated.cut, Cut::CharsDiv4);
        assert_eq!(estimated.input_tokens, prompt.chars().div_ceil(4));
    }

    #[test]
    fn a_longer_conversation_shares_the_shorter_ones_blocks() {
        let model = BlockModel::default();
        let short = prompt_from_body(Api::OpenaiChat, &body(), None).unwrap_or_default();
        let mut longer_body = body();
        if let Some(messages) = longer_body["messages"].as_array_mut() {
            messages.push(json!({"role": "user", "content": "Now read a.rs please."}));
        }
        let long = prompt_from_body(Api::OpenaiChat, &longer_body, None).unwrap_or_default();
        let a = model.cut(&short, None);
        let b = model.cut(&long, None);
        let shared = a
            .blocks
            .iter()
            .zip(&b.blocks)
            .take_while(|(x, y)| x.id == y.id)
            .count();
        // Every block but (unless the text ends on a boundary) the short prompt's folded last one.
        assert!(
            shared >= a.blocks.len() - 1,
            "{shared} of {}",
            a.blocks.len()
        );
        // Same for digests.
        let digest = |b: &Value| {
            request_digest(Api::OpenaiChat, b)
                .map(|d| model.cut(&prompt_from_digest(&d, None), None))
        };
        let (c, d) = (digest(&body()), digest(&longer_body));
        let shared = c.iter().zip(&d).map(|(c, d)| {
            c.blocks
                .iter()
                .zip(&d.blocks)
                .take_while(|(x, y)| x.id == y.id)
                .count()
        });
        assert!(shared.sum::<usize>() >= a.blocks.len() - 2);
    }

    #[test]
    fn tools_follow_the_system_message_for_qwen() {
        let mut b = body();
        b["model"] = json!("Qwen3-Coder");
        let prompt = prompt_from_body(Api::OpenaiChat, &b, None).unwrap_or_default();
        let cut = BlockModel::default().cut(&prompt, None);
        let kinds: Vec<&str> = cut.parts.iter().map(|p| p.kind.as_str()).collect();
        assert_eq!(kinds, vec!["system", "tools", "user", "assistant", "tool"]);
        let glm = BlockModel::default().cut(
            &prompt_from_body(Api::OpenaiChat, &body(), None).unwrap_or_default(),
            None,
        );
        assert_eq!(glm.parts[0].kind, "tools");
    }
}
