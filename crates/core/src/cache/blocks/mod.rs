//! The block model: a request's prompt rendered as a chat template would, cut into blocks of
//! `block_size` tokens, each block id a salted xxh3-64 chained over (parent id, block content),
//! masked below 2^53 so every JSON reader keeps it exact.
//!
//! Rendering (llmtrafficlens's layout, so figures on the same log compare): the tool
//! definitions (`<tools>` + canonical JSON), then per message `<{role}>`, `<name>{name}`,
//! `<tcid>{tool_call_id}`, the content (text parts joined), `<calls>` + the tool calls as
//! canonical JSON. Reasoning is never rendered: engines strip it before prefill. Tools lead
//! (GLM, Kimi, DeepSeek) or follow the system message (every other family, as llama-server's
//! templates render them), by model family or an explicit choice.
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

use std::sync::Arc;

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{Block, BlockKeys, Cut, PromptPart};

mod fit;
use crate::normalize::Api;
use crate::normalize::digest::{content_text, message_digest};
use crate::record::{RequestDigest, TokenCounts, hash};
pub(crate) use fit::{WeightFit, Weights};

/// Block ids stay below 2^53, the largest range of integers a JSON reader keeps exact.
pub(crate) const ID_MASK: u64 = (1 << 53) - 1;

/// Characters per token when nothing better is known.
pub(crate) const DEFAULT_TOKENS_PER_CHAR: f64 = 0.25;

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

    /// GLM, Kimi and DeepSeek templates put tool definitions first; ChatML-style templates
    /// (Qwen, SmolLM, Hermes), Llama's, Hunyuan's and llama-server's generic one put them after
    /// the system message, and so do we for unknown families: that is where llama-server renders
    /// them, and a tools-first guess makes prompts with different system messages look shared.
    pub fn for_model(model: Option<&str>) -> ToolsPosition {
        let name = model.unwrap_or_default().to_ascii_lowercase();
        if ["glm", "kimi", "deepseek"]
            .iter()
            .any(|family| name.contains(family))
        {
            ToolsPosition::Leading
        } else {
            ToolsPosition::AfterSystem
        }
    }
}

/// One part of a prompt: the tool definitions or one message.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// `tools`, a role, or `prompt` (completions API). These short strings are shared
    /// ([`SharedTexts`]), as every request re-sends them and each cut copies them into its parts.
    pub kind: Arc<str>,
    pub label: Option<Arc<str>>,
    /// The digest's hash of the part (message identity or the tools' hash).
    pub identity: u64,
    /// Rendered length in characters, markup included.
    pub chars: u64,
    /// The rendered text, when the input has it; shared, as one conversation's requests re-send
    /// the same messages ([`SharedTexts`]).
    pub text: Option<Arc<str>>,
    /// Tokens by the recording's tokenizer, when it counted them.
    pub tokens: Option<u64>,
    /// The characters of this rendering's own markup before the content (`<user>`, `<tools>`).
    pub markup_chars: u64,
    /// The content's first characters, when the input has the text.
    pub preview: Option<Arc<str>>,
}

/// One copy of each distinct segment text. A conversation's requests re-send its messages, so a
/// reader that holds many prompts at once (the profile's pending requests) held each text once
/// per turn that re-sent it. Texts are found by hash and compared whole: a collision keeps its
/// own copy, never another's text.
#[derive(Debug, Default)]
pub(crate) struct SharedTexts {
    by_hash: crate::shared::Shared<str>,
    /// Kinds, labels and previews, by content.
    short: std::collections::HashSet<Arc<str>>,
}

impl SharedTexts {
    /// Points every text of `prompt` at the copy already held, or holds it; the bytes of text
    /// held anew.
    pub(crate) fn share_prompt(&mut self, prompt: &mut Prompt) -> usize {
        let mut held = 0;
        for segment in prompt.tools.iter_mut().chain(prompt.messages.iter_mut()) {
            held += self.share(segment);
        }
        held
    }

    /// The bytes of text held anew.
    pub(crate) fn share(&mut self, segment: &mut Segment) -> usize {
        self.share_short(&mut segment.kind);
        for short in [&mut segment.label, &mut segment.preview]
            .into_iter()
            .flatten()
        {
            self.share_short(short);
        }
        match &mut segment.text {
            Some(text) => {
                let key = xxh3_64_with_seed(text.as_bytes(), 0);
                if self.by_hash.share(key, text) {
                    text.len()
                } else {
                    0
                }
            }
            None => 0,
        }
    }

    fn share_short(&mut self, short: &mut Arc<str>) {
        match self.short.get(&**short) {
            Some(held) => *short = Arc::clone(held),
            None => {
                self.short.insert(Arc::clone(short));
            }
        }
    }
}

/// A prompt as parts, before the tool definitions are placed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prompt {
    pub model: Option<String>,
    pub tools: Option<Segment>,
    pub messages: Vec<Segment>,
    /// The server's layout: tokens before the first message's content (`TokenCounts::lead`).
    pub lead_tokens: Option<u64>,
}

impl Prompt {
    pub fn chars(&self) -> u64 {
        self.tools
            .iter()
            .chain(&self.messages)
            .map(|s| s.chars)
            .sum()
    }

    fn ordered(&self, position: ToolsPosition) -> Vec<&Segment> {
        let mut out: Vec<&Segment> = Vec::with_capacity(self.messages.len() + 1);
        let after_system = position == ToolsPosition::AfterSystem
            && self.messages.first().is_some_and(|m| &*m.kind == "system");
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

fn preview(text: &str) -> Option<Arc<str>> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return None;
    }
    let mut out: String = trimmed.chars().take(PREVIEW_CHARS).collect();
    if trimmed.chars().nth(PREVIEW_CHARS).is_some() {
        out.push('…');
    }
    Some(out.into())
}

fn label_of(name: Option<&str>, tool_call_id: Option<&str>) -> Option<Arc<str>> {
    name.or(tool_call_id).map(Arc::from)
}

/// The prompt of a request body with its text (full recordings, gateway logs). `None` when the
/// body holds no prompt this model understands.
pub(crate) fn prompt_from_body(
    api: Api,
    body: &Value,
    counts: Option<&TokenCounts>,
) -> Option<Prompt> {
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
                markup_chars: 0,
                preview: preview(&text),
                text: Some(text.into()),
            }],
            lead_tokens: None,
        });
    }
    let (messages, tools) = crate::normalize::chat_request(api, body)?;
    let tools_segment = (!tools.is_empty()).then(|| {
        let names: Vec<&str> = tools.iter().filter_map(tool_name).collect();
        let array = Value::Array(tools.to_vec());
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
            label: Some(names.join(", ").into()),
            identity: hex_to_u64(&identity),
            chars: char_count(&text),
            text: Some(text.into()),
            tokens,
            markup_chars: "<tools>".len() as u64,
            preview: None,
        }
    });
    let segments = messages
        .iter()
        .filter(|m| m.is_object())
        .map(|message| message_segment(message, counts))
        .collect();
    Some(Prompt {
        model,
        tools: tools_segment,
        messages: segments,
        lead_tokens: layout_lead(counts),
    })
}

/// One message as the template renders it: the role header, the text, a marker per image,
/// audio or file part (by a hash of its URL or data: two prompts with different images never
/// share that block), then the tool calls.
fn message_segment(message: &Value, counts: Option<&TokenCounts>) -> Segment {
    let role = str_field(message, "role").unwrap_or_default();
    let name = str_field(message, "name").or_else(|| str_field(message, "tool_name"));
    let tool_call_id = str_field(message, "tool_call_id");
    let content = content_text(message.get("content"));
    let mut text = header(role, name, tool_call_id);
    text.push_str(&content);
    push_media_markers(message, &mut text);
    if let Some((sent, calls)) = message
        .get("tool_calls")
        .and_then(|sent| Some((sent, sent.as_array()?)))
        .filter(|(_, calls)| !calls.is_empty())
    {
        // Without a streamed reply's `index`, which no template renders: a harness that sends
        // it back and one that drops it send the same call (`reply_segment` drops it too).
        text.push_str("<calls>");
        if calls.iter().any(|call| call.get("index").is_some()) {
            let calls: Vec<Value> = calls
                .iter()
                .map(|call| {
                    let mut call = call.clone();
                    if let Some(fields) = call.as_object_mut() {
                        fields.remove("index");
                    }
                    call
                })
                .collect();
            text.push_str(&hash::canonical_json(&Value::Array(calls)));
        } else {
            text.push_str(&hash::canonical_json(sent));
        }
    }
    let digest = message_digest(message);
    let tokens = counts
        .and_then(|c| c.messages.get(&digest.hash))
        .map(|&n| u64::from(n));
    let identity = digest.identity.unwrap_or(digest.hash);
    Segment {
        kind: role.into(),
        label: label_of(name, tool_call_id),
        identity: hex_to_u64(&identity),
        chars: char_count(&text),
        text: Some(text.into()),
        tokens,
        markup_chars: char_count(&header(role, name, tool_call_id)),
        preview: preview(&content),
    }
}

/// Content parts that are not text: OpenAI's `image_url`, `input_audio`, `file`, Anthropic's
/// `image` and `document` (as chat form keeps them), Ollama's `images` array.
fn push_media_markers(message: &Value, text: &mut String) {
    let parts = message
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|part| {
            part.get("type")
                .and_then(Value::as_str)
                .is_some_and(|kind| kind != "text")
        });
    let images = message
        .get("images")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for part in parts.chain(images) {
        text.push_str("<media:");
        text.push_str(&hash::hex_value(part));
        text.push('>');
    }
}

/// The reply as the next turn sends it back, rendered as that turn's assistant message (its
/// text and tool calls; `completion_tokens` its weight). `None` when the response holds no
/// reply, or when the reply holds reasoning: the engine generated the reasoning into the slot
/// first and the next turn does not render it, so nothing past the prompt can be reused.
pub(crate) fn reply_segment(
    api: Api,
    response: &Value,
    completion_tokens: Option<u64>,
) -> Option<Segment> {
    let message = crate::normalize::chat_reply(api, response)?;
    let reasoned = ["reasoning_content", "reasoning", "thinking"]
        .iter()
        .any(|key| {
            message
                .get(*key)
                .and_then(Value::as_str)
                .is_some_and(|r| !r.is_empty())
        });
    if reasoned || !message.is_object() {
        return None;
    }
    // The shape harnesses send back: a call's id, type and function (name, arguments), without
    // the stream's `index`.
    let calls: Vec<Value> = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|call| {
            let mut kept = serde_json::Map::new();
            for key in ["id", "type", "function"] {
                if let Some(value) = call.get(key) {
                    kept.insert(key.to_string(), value.clone());
                }
            }
            Value::Object(kept)
        })
        .collect();
    let mut sent = serde_json::Map::new();
    sent.insert("role".into(), Value::from("assistant"));
    sent.insert(
        "content".into(),
        message.get("content").cloned().unwrap_or(Value::Null),
    );
    if !calls.is_empty() {
        sent.insert("tool_calls".into(), Value::Array(calls));
    }
    let sent = Value::Object(sent);
    if content_text(sent.get("content")).is_empty() && sent.get("tool_calls").is_none() {
        return None;
    }
    let mut segment = message_segment(&sent, None);
    segment.tokens = completion_tokens;
    Some(segment)
}

fn tool_name(tool: &Value) -> Option<&str> {
    tool.pointer("/function/name")
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
}

/// The prompt of a digest recording: sizes and hashes, no text. Character counts equal the
/// full rendering's, so a full and a digest recording of the same traffic place their blocks
/// at the same token positions.
pub(crate) fn prompt_from_digest(digest: &RequestDigest, counts: Option<&TokenCounts>) -> Prompt {
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
                    .join(", ")
                    .into(),
            ),
            identity: digest.tools_hash.as_deref().map_or(0, hex_to_u64),
            chars: "<tools>".len() as u64 + json_chars,
            text: None,
            tokens,
            markup_chars: "<tools>".len() as u64,
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
                kind: m.role.as_str().into(),
                label: label_of(m.name.as_deref(), m.tool_call_id.as_deref()),
                identity: hex_to_u64(m.identity.as_deref().unwrap_or(&m.hash)),
                chars: char_count(&header) + u64::from(m.chars) + calls_marker,
                text: None,
                tokens: counts
                    .and_then(|c| c.messages.get(&m.hash))
                    .map(|&n| u64::from(n)),
                markup_chars: char_count(&header),
                preview: None,
            }
        })
        .collect();
    Prompt {
        model: digest.model.clone(),
        tools,
        messages,
        lead_tokens: layout_lead(counts),
    }
}

/// The layout's lead, where the counts are the server's layout.
fn layout_lead(counts: Option<&TokenCounts>) -> Option<u64> {
    counts
        .filter(|c| c.layout)
        .and_then(|c| c.lead)
        .map(u64::from)
}

/// Tokens per character over every prompt whose server count is known; the default when none.
pub(crate) fn tokens_per_char(prompts: impl IntoIterator<Item = (u64, Option<u64>)>) -> f64 {
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
    /// The text's ratio (replies are weighed by it too).
    pub tokens_per_char: f64,
    /// What parts weigh; `None`: `tokens_per_char` for every character.
    pub weights: Option<Weights>,
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
            weights: None,
            keys_from_messages: false,
        }
    }
}

/// Seed of a model's root id (any fixed value: it only has to differ from a block's chain).
const ROOT_SEED: u64 = 0x6d6f_64656c;

/// Most prefix ends an input's [`Anchors`] remember (16 bytes each); past it, new prefixes are
/// cut by the ratio alone, as before anything was learned.
pub(crate) const MAX_ANCHORS: usize = 1 << 22;

/// Where earlier prompts' prefixes of parts ended, in tokens: fixed the first time each prefix
/// was cut, so every later prompt that starts with the same parts puts its blocks at the same
/// characters. A request's own server count fixes where its last part ends, and its reply's
/// count where the reply ends, so the next turn (which starts with both) is cut exactly as the
/// cache holds them, and its reuse is measured in the server's own tokens.
#[derive(Debug, Clone, Default)]
pub struct Anchors {
    ends: super::IdMap<u64, f64>,
    /// Tokens per character inside a part, by the parts before it and its role: fixed by the
    /// first part counted there, so the reply and the same reply re-sent, or a message and
    /// its edit, keep their boundaries where their text is the same.
    ratios: super::IdMap<u64, f64>,
}

impl Anchors {
    fn get(&self, chain: u64) -> Option<f64> {
        self.ends.get(&chain).copied()
    }

    fn insert(&mut self, chain: u64, end: f64) {
        if self.ends.len() < MAX_ANCHORS {
            self.ends.entry(chain).or_insert(end);
        }
    }

    /// The ratio fixed at `key`, or `own`, which is fixed there if nothing was.
    fn ratio(&mut self, key: u64, own: f64) -> f64 {
        if let Some(&known) = self.ratios.get(&key) {
            return known;
        }
        if self.ratios.len() < MAX_ANCHORS {
            self.ratios.insert(key, own);
        }
        own
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

/// The key of a prefix of parts: the previous prefix's key and this part's content (its text
/// where there is one, so a reply re-sent with another JSON shape but the same rendering still
/// matches; its digest hash otherwise).
/// The key of a part's place: the parts before it and its role.
fn ratio_key(parent: u64, kind: &str) -> u64 {
    let mut bytes = Vec::with_capacity(8 + kind.len());
    bytes.extend_from_slice(&parent.to_le_bytes());
    bytes.extend_from_slice(kind.as_bytes());
    xxh3_64_with_seed(&bytes, 3)
}

fn anchor_chain(parent: u64, segment: &Segment) -> u64 {
    let own = match &segment.text {
        Some(text) => xxh3_64_with_seed(text.as_bytes(), 1),
        None => segment.identity,
    };
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&parent.to_le_bytes());
    bytes[8..].copy_from_slice(&own.to_le_bytes());
    xxh3_64_with_seed(&bytes, 2)
}

/// The block model and what it learned from the prompts it cut so far: one per input, fed in
/// the order the simulation replays (the profile, the live engine and the exports all cut
/// through one).
#[derive(Debug, Clone)]
pub struct Cutter {
    pub model: BlockModel,
    anchors: Anchors,
}

impl Cutter {
    pub fn new(model: BlockModel) -> Cutter {
        Cutter {
            model,
            anchors: Anchors::default(),
        }
    }

    pub fn anchors(&self) -> &Anchors {
        &self.anchors
    }

    /// Cuts `prompt` into blocks. `prompt_tokens` is the server's count, when it gave one.
    pub fn cut(&mut self, prompt: &Prompt, prompt_tokens: Option<u64>) -> CutPrompt {
        let position = self.position(prompt);
        let segments = prompt.ordered(position);
        self.model.cut_segments(
            prompt.model.as_deref(),
            &segments,
            prompt_tokens,
            prompt.lead_tokens,
            &mut self.anchors,
        )
    }

    /// The blocks a server holds once it has answered: the prompt followed by the reply as the
    /// next turn renders it, `total_tokens` (prompt + completion, when the server counted both)
    /// in all. Cut after the prompt itself, so the two share every block the prompt fills.
    pub fn cut_with_reply(
        &mut self,
        prompt: &Prompt,
        reply: &Segment,
        total_tokens: Option<u64>,
    ) -> Vec<Block> {
        let position = self.position(prompt);
        let mut segments = prompt.ordered(position);
        segments.push(reply);
        self.model
            .cut_segments(
                prompt.model.as_deref(),
                &segments,
                total_tokens,
                prompt.lead_tokens,
                &mut self.anchors,
            )
            .blocks
    }

    /// One request: its prompt, then (where its reply is known) what it leaves cached: the
    /// prompt and the reply but its last block, which holds the last token generated: sampled,
    /// never evaluated, so no engine holds it (llama.cpp reuses `prompt + completion − 1` on the
    /// next turn; a block engine caches full blocks only). In that order, as the profile, the
    /// live engine and the exports all cut, so their anchors agree.
    pub fn cut_turn(
        &mut self,
        prompt: &Prompt,
        prompt_tokens: Option<u64>,
        reply: Option<&Segment>,
        completion_tokens: Option<u64>,
    ) -> (CutPrompt, Vec<Block>) {
        let cut = self.cut(prompt, prompt_tokens);
        let cached_after = match reply {
            Some(reply) => {
                let total = prompt_tokens.zip(completion_tokens).map(|(p, c)| p + c);
                let mut held = self.cut_with_reply(prompt, reply, total);
                if held.len() > cut.blocks.len() {
                    held.pop();
                }
                held
            }
            None => Vec::new(),
        };
        (cut, cached_after)
    }

    fn position(&self, prompt: &Prompt) -> ToolsPosition {
        self.model
            .tools_position
            .unwrap_or_else(|| ToolsPosition::for_model(prompt.model.as_deref()))
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

    /// Cuts `prompt` on its own (no earlier prompt fixes where its parts end). Inputs cut
    /// through a [`Cutter`], which remembers.
    pub fn cut(&self, prompt: &Prompt, prompt_tokens: Option<u64>) -> CutPrompt {
        Cutter::new(self.clone()).cut(prompt, prompt_tokens)
    }

    /// The id every chain of this prompt's blocks starts from: its model's, so two models never
    /// share a cached block (they run on separate caches).
    fn root(&self, model: Option<&str>) -> u64 {
        model.map_or(0, |m| self.chain(ROOT_SEED, m.as_bytes()))
    }

    fn cut_segments(
        &self,
        model: Option<&str>,
        segments: &[&Segment],
        prompt_tokens: Option<u64>,
        lead_tokens: Option<u64>,
        anchors: &mut Anchors,
    ) -> CutPrompt {
        let total_chars: u64 = segments.iter().map(|s| s.chars).sum();
        let counted = !segments.is_empty() && segments.iter().all(|s| s.tokens.is_some());
        let root = self.root(model);

        // Token position where each segment ends (piecewise linear in characters). Without the
        // tokenizer's counts: where an earlier prompt fixed the end of the same prefix of parts,
        // there; the last part ends at the server's count; any other part weighs its
        // characters × the input's ratio.
        let mut token_ends = Vec::with_capacity(segments.len());
        let mut running = 0f64;
        let mut chain = root;
        let weights = self
            .weights
            .unwrap_or_else(|| Weights::ratio(self.tokens_per_char));
        // The template's default system message, before the first message of a prompt that has
        // none of its own.
        let default_system = segments
            .iter()
            .position(|s| &*s.kind != "tools")
            .filter(|&first| &*segments[first].kind != "system");
        // Where each part's tokens sit in its characters (`char_within`): with counts, its
        // tokens start at its content (after the lead, in the first part) at the ratio fixed
        // for its place; else at the fitted ratio from its start.
        let mut placements = Vec::with_capacity(segments.len());
        for (i, segment) in segments.iter().enumerate() {
            if counted {
                let tokens = segment.tokens.unwrap_or_default() as f64;
                let lead = match i {
                    0 if &*segment.kind != "tools" => lead_tokens.map(|n| n as f64),
                    _ => Some(0.0),
                };
                let text = match lead {
                    Some(_) => segment.chars.saturating_sub(segment.markup_chars),
                    None => segment.chars,
                } as f64;
                let own = if text > 0.0 && tokens > lead.unwrap_or(0.0) {
                    (tokens - lead.unwrap_or(0.0)) / text
                } else {
                    weights.per_char(segment)
                };
                let place = ratio_key(chain, &segment.kind);
                placements.push((lead, anchors.ratio(place, own)));
                chain = anchor_chain(chain, segment);
                running += tokens;
                token_ends.push(running);
                continue;
            }
            placements.push((None, weights.per_char(segment)));
            chain = anchor_chain(chain, segment);
            let end = match anchors.get(chain) {
                Some(known) => known.max(running),
                None => match prompt_tokens {
                    Some(tokens) if i + 1 == segments.len() => (tokens as f64).max(running),
                    _ => {
                        let template = if default_system == Some(i) {
                            weights.per_missing_system
                        } else {
                            0.0
                        };
                        running + weights.of(segment) + template
                    }
                },
            };
            anchors.insert(chain, end);
            running = end;
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

        // Character offset where each block ends; token positions only grow, so one walk over
        // the segments serves every block.
        let mut ends = Vec::with_capacity(block_count as usize);
        let mut segment = 0usize;
        let mut start_token = 0f64;
        let mut start_char = 0u64;
        for k in 0..block_count {
            if k + 1 == block_count {
                ends.push(total_chars);
                break;
            }
            let token = ((k + 1) * block_size) as f64;
            while segment < segments.len() && token >= token_ends[segment] {
                start_token = token_ends[segment];
                start_char += segments[segment].chars;
                segment += 1;
            }
            let at = match segments.get(segment) {
                Some(s) => {
                    // Inside a part, tokens sit at the input's fixed ratio from the part's
                    // start, never at the part's own: the same text rendered with another count
                    // (a reply, then the same reply as the next turn's message with its
                    // template tokens; a system prompt edited at its end) keeps its boundaries,
                    // so the unchanged head matches. Tokens past the text are the template's.
                    // With the server's layout a part's tokens start at its content (its role
                    // header closes the part before), the first part's after the lead.
                    let (lead, per_char) = placements[segment];
                    let within = char_within(token - start_token, s, lead, per_char);
                    start_char + within.min(s.chars)
                }
                None => total_chars,
            };
            ends.push(at.min(total_chars));
        }

        let use_text = !self.keys_from_messages && segments.iter().all(|s| s.text.is_some());
        let keys = if use_text {
            BlockKeys::Content
        } else {
            BlockKeys::MessageDigest
        };
        let ids = if use_text {
            self.content_ids(root, segments, &ends)
        } else {
            self.digest_ids(root, segments, &ends)
        };
        // A partial last block is keyed by its token count too: the same text followed by more
        // template tokens is not the block the cache holds (and an export's hash ids tell them
        // apart the same way).
        let blocks = ids
            .into_iter()
            .enumerate()
            .map(|(k, id)| {
                let tokens = (total_tokens - k as u64 * block_size).min(block_size);
                Block {
                    id: if tokens < block_size {
                        self.chain(id, &tokens.to_le_bytes())
                    } else {
                        id
                    },
                    tokens: tokens as u32,
                }
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

    fn content_ids(&self, root: u64, segments: &[&Segment], ends: &[u64]) -> Vec<u64> {
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
        let mut parent = root;
        let mut start = 0usize;
        let mut ids = Vec::with_capacity(ends.len());
        for end in byte_ends {
            parent = self.chain(parent, &text.as_bytes()[start..end.max(start)]);
            ids.push(parent);
            start = end.max(start);
        }
        ids
    }

    fn digest_ids(&self, root: u64, segments: &[&Segment], ends: &[u64]) -> Vec<u64> {
        let mut segment_ends = Vec::with_capacity(segments.len());
        let mut running = 0u64;
        for s in segments {
            running += s.chars;
            segment_ends.push(running);
        }
        let mut parent = root;
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

/// Where the token `offset` tokens into part `s` ends, in characters from the part's start:
/// at `per_char` tokens a character; with the server's layout, the part's markup (the
/// rendering's `<role>`) shares the `lead` tokens before its content, and the content follows.
fn char_within(offset: f64, s: &Segment, lead: Option<f64>, per_char: f64) -> u64 {
    let markup = s.markup_chars.min(s.chars) as f64;
    let at = match lead {
        Some(lead) if offset < lead => offset / lead * markup,
        Some(lead) => markup + (offset - lead) / per_char,
        None => offset / per_char,
    };
    at.floor().max(0.0) as u64
}

/// The prompt body a request carries (full mode), for the APIs the block model renders.
pub(crate) fn renders(api: Api) -> bool {
    api.is_chat() || api == Api::OpenaiCompletions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::digest::request_digest;
    use serde_json::json;

    /// Two turns of one conversation: the messages the second re-sends point at the first's
    /// texts; its new message and the other prompt's keep their own.
    #[test]
    fn a_text_sent_again_is_held_once() {
        let first = json!({"model": "m", "messages": [
            {"role": "system", "content": "You help."}, {"role": "user", "content": "hi"}]});
        let second = json!({"model": "m", "messages": [
            {"role": "system", "content": "You help."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]});
        let mut shared = SharedTexts::default();
        let mut a = prompt_from_body(Api::OpenaiChat, &first, None).unwrap_or_default();
        let mut b = prompt_from_body(Api::OpenaiChat, &second, None).unwrap_or_default();
        let unshared = b.clone();
        shared.share_prompt(&mut a);
        shared.share_prompt(&mut b);
        assert_eq!(b, unshared, "sharing changes no text");
        let same = |x: &Segment, y: &Segment| match (&x.text, &y.text) {
            (Some(x), Some(y)) => std::sync::Arc::ptr_eq(x, y),
            _ => false,
        };
        assert!(same(&a.messages[0], &b.messages[0]));
        assert!(same(&a.messages[1], &b.messages[1]));
        assert!(!same(&a.messages[1], &b.messages[3]));
    }

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

    fn chat(messages: Value) -> Prompt {
        prompt_from_body(
            Api::OpenaiChat,
            &json!({"model": "m", "messages": messages}),
            None,
        )
        .unwrap_or_default()
    }

    fn shared(a: &[Block], b: &[Block]) -> u64 {
        a.iter()
            .zip(b)
            .take_while(|(x, y)| x.id == y.id)
            .map(|(x, _)| u64::from(x.tokens))
            .sum()
    }

    #[test]
    fn the_next_turn_shares_the_prompt_and_the_reply_to_the_token() {
        let model = BlockModel {
            block_size: 1,
            ..BlockModel::default()
        };
        let mut cutter = Cutter::new(model);
        let first = chat(json!([
            {"role": "system", "content": "You are terse. ".repeat(10)},
            {"role": "user", "content": "List the files."}]));
        let response =
            json!({"choices": [{"message": {"role": "assistant", "content": "a.rs b.rs"}}]});
        let reply = reply_segment(Api::OpenaiChat, &response, Some(5)).unwrap();
        let cut = cutter.cut(&first, Some(61));
        assert_eq!(cut.input_tokens, 61);
        let cached = cutter.cut_with_reply(&first, &reply, Some(66));
        assert_eq!(cached.len(), 66);
        // The cached sequence starts with the prompt's blocks.
        assert_eq!(shared(&cut.blocks, &cached), 61);
        // The next turn renders the reply and adds a question: it reuses all 66 tokens, which
        // sit where the server counted them whatever the characters weigh.
        let second = chat(json!([
            {"role": "system", "content": "You are terse. ".repeat(10)},
            {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": "a.rs b.rs"},
            {"role": "user", "content": "Read a.rs."}]));
        let next = cutter.cut(&second, Some(80));
        assert_eq!(shared(&cached, &next.blocks), 66);
    }

    #[test]
    fn replies_with_reasoning_or_nothing_are_not_cached_and_calls_lose_their_stream_index() {
        let reasoned = json!({"choices": [{"message": {"role": "assistant", "content": "x",
            "reasoning_content": "think"}}]});
        assert!(reply_segment(Api::OpenaiChat, &reasoned, None).is_none());
        let empty = json!({"choices": [{"message": {"role": "assistant", "content": ""}}]});
        assert!(reply_segment(Api::OpenaiChat, &empty, None).is_none());
        let streamed = json!({"choices": [{"message": {"role": "assistant", "content": null,
            "tool_calls": [{"index": 0, "id": "c1", "type": "function",
                "function": {"name": "ls", "arguments": "{}"}}]}}]});
        let sent = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
            "type": "function", "function": {"name": "ls", "arguments": "{}"}}]});
        let reply = reply_segment(Api::OpenaiChat, &streamed, Some(3)).unwrap();
        assert_eq!(reply.text, message_segment(&sent, None).text);
        assert_eq!(reply.tokens, Some(3));
    }

    #[test]
    fn models_and_images_keep_their_blocks_apart() {
        let model = BlockModel::default();
        let body = |name: &str, image: &str| {
            json!({"model": name, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is in this picture? ".repeat(8)},
                {"type": "image_url", "image_url": {"url": image}}]}]})
        };
        let cut = |b: Value| {
            model
                .cut(
                    &prompt_from_body(Api::OpenaiChat, &b, None).unwrap_or_default(),
                    None,
                )
                .blocks
        };
        let a = cut(body("m", "data:a"));
        assert_eq!(
            shared(&a, &cut(body("m", "data:a"))),
            a.iter().map(|b| u64::from(b.tokens)).sum::<u64>()
        );
        assert_eq!(shared(&a, &cut(body("other", "data:a"))), 0);
        let with_other_image = cut(body("m", "data:b"));
        let total: u64 = a.iter().map(|b| u64::from(b.tokens)).sum();
        assert!(shared(&a, &with_other_image) < total);
        assert!(shared(&a, &with_other_image) > 0);
    }

    #[test]
    fn the_fit_finds_what_text_tools_and_the_template_weigh_despite_one_quirk() {
        // A template that ignores tools, adds 3 tokens per message and a 20-token default
        // system prompt where there is none; one request off by 40 tokens.
        let mut fit = WeightFit::default();
        for i in 0..12u64 {
            let mut messages =
                vec![json!({"role": "system", "content": "s".repeat(100 + 10 * i as usize)})];
            for k in 0..(i % 4) {
                messages.push(json!({"role": "user", "content": "u".repeat(50 + 7 * k as usize)}));
            }
            let mut prompt = chat(Value::Array(messages));
            if i % 3 == 0 {
                prompt.messages.remove(0);
            }
            prompt.tools = Some(Segment {
                kind: "tools".into(),
                label: None,
                identity: 1,
                chars: 300 + 20 * i,
                text: None,
                tokens: None,
                markup_chars: 0,
                preview: None,
            });
            let text: u64 = prompt.messages.iter().map(|m| m.chars).sum();
            let missing = prompt.messages.first().is_none_or(|m| &*m.kind != "system");
            let mut tokens =
                text / 4 + 3 * prompt.messages.len() as u64 + if missing { 20 } else { 0 };
            if i == 5 {
                tokens += 40;
            }
            fit.add(i, &prompt, tokens);
        }
        let w = fit.weights();
        assert!((w.per_text_char - 0.25).abs() < 0.02, "{w:?}");
        assert!(w.per_tools_char < 0.02, "{w:?}");
        assert!((w.per_message - 3.0).abs() < 1.5, "{w:?}");
        assert!((w.per_missing_system - 20.0).abs() < 3.0, "{w:?}");
        // Too few requests for any fit: the single ratio.
        let mut few = WeightFit::default();
        few.add(0, &chat(json!([{"role": "user", "content": "abcd"}])), 4);
        assert_eq!(few.weights(), Weights::ratio(few.ratio()));
    }

    #[test]
    fn tools_follow_the_system_message_for_qwen() {
        let mut b = body();
        b["model"] = json!("Qwen3-Coder");
        let prompt = prompt_from_body(Api::OpenaiChat, &b, None).unwrap_or_default();
        let cut = BlockModel::default().cut(&prompt, None);
        let kinds: Vec<&str> = cut.parts.iter().map(|p| &*p.kind).collect();
        assert_eq!(kinds, vec!["system", "tools", "user", "assistant", "tool"]);
        let mut b = body();
        b["model"] = json!("GLM-4.6");
        let glm = BlockModel::default().cut(
            &prompt_from_body(Api::OpenaiChat, &b, None).unwrap_or_default(),
            None,
        );
        assert_eq!(&*glm.parts[0].kind, "tools");
        // Unknown families: after the system message, where llama-server renders them.
        let unknown = BlockModel::default().cut(
            &prompt_from_body(Api::OpenaiChat, &body(), None).unwrap_or_default(),
            None,
        );
        assert_eq!(&*unknown.parts[1].kind, "tools");
    }
}
