//! From what the wire carried to what the analysis reads: which API an exchange used, how a
//! stream merges into the non-streamed shape, and the Anthropic Messages and OpenAI Responses
//! APIs in chat form.

pub(crate) mod anthropic;
pub mod digest;
pub(crate) mod exchange;
pub(crate) mod measured;
pub(crate) mod responses;
pub(crate) mod stream;

pub use anthropic::{chat_messages, chat_tools, function_tool};
pub use exchange::{Exchange, closed_after_completion, normalize};
pub use measured::{Measured, Source};

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Messages and tools in chat form, borrowed from the body where it already is.
pub type ChatRequest<'a> = (Cow<'a, [Value]>, Cow<'a, [Value]>);

/// A request's messages and tools in chat form: Anthropic Messages and the Responses API
/// converted, the chat APIs as sent (borrowed). `None` when the body holds no messages.
pub fn chat_request(api: Api, body: &Value) -> Option<ChatRequest<'_>> {
    match api {
        Api::AnthropicMessages => {
            body.get("messages")?.as_array()?;
            Some((
                Cow::Owned(anthropic::chat_messages(body)),
                Cow::Owned(anthropic::chat_tools(body)),
            ))
        }
        Api::OpenaiResponses => responses::has_input(body).then(|| {
            (
                Cow::Owned(responses::chat_messages(body)),
                Cow::Owned(responses::chat_tools(body)),
            )
        }),
        _ => {
            let messages = body.get("messages")?.as_array()?;
            let tools = body
                .get("tools")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            Some((Cow::Borrowed(messages.as_slice()), Cow::Borrowed(tools)))
        }
    }
}

/// A response's reply as a chat message (`None` when the body holds none).
pub fn chat_reply(api: Api, body: &Value) -> Option<Value> {
    match api {
        Api::AnthropicMessages => Some(anthropic::chat_reply(body)),
        Api::OpenaiResponses => Some(responses::chat_reply(body)),
        _ => body
            .pointer("/choices/0/message")
            .or_else(|| body.get("message"))
            .cloned(),
    }
}

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
            Api::OpenaiChat | Api::OllamaChat | Api::AnthropicMessages | Api::OpenaiResponses
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
