//! From what the wire carried to what the analysis reads: which API an exchange used, how a
//! stream merges into the non-streamed shape, and the Anthropic Messages API in chat form.

pub mod anthropic;
pub mod digest;
pub mod exchange;
pub mod measured;
pub mod stream;

use serde::{Deserialize, Serialize};

/// Detected from the request path only (the body may be absent, e.g. in digest mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    OpenaiChat,
    OllamaChat,
    AnthropicMessages,
    OpenaiCompletions,
    OpenaiResponses,
    Other,
}

impl Api {
    pub fn from_path(path: &str) -> Api {
        let path = path
            .split('?')
            .next()
            .unwrap_or_default()
            .trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Api::OpenaiChat
        } else if path.ends_with("/api/chat") {
            Api::OllamaChat
        } else if path.ends_with("/v1/messages") {
            Api::AnthropicMessages
        } else if path.ends_with("/completions") {
            Api::OpenaiCompletions
        } else if path.ends_with("/responses") {
            Api::OpenaiResponses
        } else {
            Api::Other
        }
    }

    /// Chat APIs are the ones the analysis reads and digest mode digests.
    pub fn is_chat(self) -> bool {
        matches!(
            self,
            Api::OpenaiChat | Api::OllamaChat | Api::AnthropicMessages
        )
    }

    /// Whether the proxy stores request and response bodies for this API (other paths are
    /// recorded without a body).
    pub fn keeps_bodies(self) -> bool {
        self != Api::Other
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Api::OpenaiChat => "openai_chat",
            Api::OllamaChat => "ollama_chat",
            Api::AnthropicMessages => "anthropic_messages",
            Api::OpenaiCompletions => "openai_completions",
            Api::OpenaiResponses => "openai_responses",
            Api::Other => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_from_path() {
        assert_eq!(Api::from_path("/v1/chat/completions"), Api::OpenaiChat);
        assert_eq!(Api::from_path("/v1/chat/completions?x=1"), Api::OpenaiChat);
        assert_eq!(Api::from_path("/api/chat"), Api::OllamaChat);
        assert_eq!(Api::from_path("/v1/messages"), Api::AnthropicMessages);
        assert_eq!(Api::from_path("/v1/completions"), Api::OpenaiCompletions);
        assert_eq!(Api::from_path("/v1/responses"), Api::OpenaiResponses);
        assert_eq!(Api::from_path("/v1/models"), Api::Other);
        assert_eq!(Api::from_path("/v1/messages/count_tokens"), Api::Other);
    }
}
