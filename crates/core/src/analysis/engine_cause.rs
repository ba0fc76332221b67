//! prefixscope: what in the engine made it re-evaluate a prompt that continued its
//! conversation unchanged while nothing ran in between (llmp's `server_*` losses). llmp says
//! where the reuse stopped; this names the likely mechanism and the evidence for it, from the
//! model (its architecture, from the name the server answers with: llama.cpp answers with the
//! model file's path) and the server's own counters. Pure.

use serde::{Deserialize, Serialize};

/// The engine's mechanism, as far as the evidence goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// Sliding-window attention: llama.cpp keeps the window layers' cache for the last window
    /// only, so a prompt that stops matching before the end of what the slot holds (the reply
    /// is always re-rendered) is re-evaluated whole ("forcing full prompt re-processing due to
    /// lack of cache data (likely due to SWA or hybrid/recurrent memory)").
    SlidingWindow,
    /// Hybrid or recurrent memory (Mamba, RWKV, …): one state per slot that cannot roll back.
    RecurrentMemory,
    /// The server loaded the model again before this request (Ollama's `load_duration`, or
    /// another model in its `/props` between the turns).
    ModelReload,
    /// The server's probes found it down or loading between the turns.
    Restart,
    /// The prompt filled the slot's context (`n_ctx` from the server's probes).
    ContextShift,
    /// No evidence names it: a restart, the server's own eviction, or a cache it cannot reuse.
    Unexplained,
}

impl EngineKind {
    /// For a person: `sliding-window cache`.
    pub fn label(self) -> &'static str {
        match self {
            EngineKind::SlidingWindow => "sliding-window cache",
            EngineKind::RecurrentMemory => "recurrent memory",
            EngineKind::ModelReload => "model reloaded",
            EngineKind::Restart => "server restarted",
            EngineKind::ContextShift => "context full",
            EngineKind::Unexplained => "server dropped it",
        }
    }

    /// What to change on the server, in its own flags.
    pub fn fix(self) -> &'static str {
        match self {
            EngineKind::SlidingWindow => {
                "the model's sliding-window cache cannot serve a prefix that stops before its end: start llama-server with --swa-full (a full-size cache for the window layers, more memory), or raise --ctx-checkpoints"
            }
            EngineKind::RecurrentMemory => {
                "the model's recurrent state cannot roll back to a shorter prefix: raise llama-server's --ctx-checkpoints so a checkpoint near the prefix can be restored"
            }
            EngineKind::ModelReload => {
                "the server loaded the model again: keep it loaded (Ollama: keep_alive, OLLAMA_KEEP_ALIVE=-1; no more models than OLLAMA_MAX_LOADED_MODELS)"
            }
            EngineKind::Restart => {
                "the server went down or reloaded between the turns and its cache with it: keep it running (llama-server's --slot-save-path can save and restore slots across a restart)"
            }
            EngineKind::ContextShift => {
                "the prompt fills the slot's context, so the server shifts or truncates it: give each slot more context (-c, fewer -np), or compact the conversation before it fills"
            }
            EngineKind::Unexplained => {
                "the server dropped or trimmed a cached prefix although the prompt matched: the server's doing (a context shift, a sliding-window cache, a restart), not the client's"
            }
        }
    }
}

/// A row's engine cause: the mechanism and what shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineCause {
    pub kind: EngineKind,
    pub evidence: String,
}

/// A model's memory, from its name: the families whose cache llama.cpp cannot reuse past a
/// point. Only names that say it; anything else is `None` (full attention or not known).
pub(crate) fn memory_of(model: &str) -> Option<(EngineKind, &'static str)> {
    // Lower-cased, separators dropped: `Gemma-3-4B`, `gemma3:4b` and `google_gemma-3` agree.
    let name: String = model
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or(model)
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    const SLIDING: [(&str, &str); 6] = [
        ("gemma2", "Gemma 2"),
        ("gemma3", "Gemma 3"),
        ("gemma4", "Gemma 4"),
        ("gptoss", "gpt-oss"),
        ("commandr7b", "Command R7B"),
        ("commanda", "Command A"),
    ];
    const RECURRENT: [(&str, &str); 9] = [
        ("mamba", "Mamba"),
        ("jamba", "Jamba"),
        ("rwkv", "RWKV"),
        ("qwen3next", "Qwen3-Next"),
        ("granite4.0h", "Granite 4.0 H"),
        ("lfm2", "LFM2"),
        ("nemotronh", "Nemotron-H"),
        ("falconh1", "Falcon-H1"),
        ("zamba", "Zamba"),
    ];
    let found = |list: &[(&'static str, &'static str)]| {
        list.iter()
            .find(|(key, _)| name.contains(key))
            .map(|(_, family)| *family)
    };
    found(&SLIDING)
        .map(|family| (EngineKind::SlidingWindow, family))
        .or_else(|| found(&RECURRENT).map(|family| (EngineKind::RecurrentMemory, family)))
}

/// The attention window of a sliding-window family, in tokens, from its model cards (Gemma 2
/// 4,096, Gemma 3 1,024, Gemma 4 512, gpt-oss 128, Command R7B and Command A 4,096): what a
/// server that does not say its own (`/props`' `n_swa`) is assumed to run.
pub(crate) fn sliding_window_of(model: &str) -> Option<(u64, &'static str)> {
    let (kind, family) = memory_of(model)?;
    if kind != EngineKind::SlidingWindow {
        return None;
    }
    let window = match family {
        "Gemma 3" => 1_024,
        "Gemma 4" => 512,
        "gpt-oss" => 128,
        _ => 4_096,
    };
    Some((window, family))
}

/// A model load this long before a request is a reload, not the warm path (Ollama reports a
/// few milliseconds when the model is resident).
pub(crate) const RELOAD_MS: f64 = 500.0;

/// The engine cause of a `server_*` loss (`loss_cause`) on a request to `model`, whose server
/// reported `reused` tokens of `prompt` and spent `load_ms` loading the model.
pub(crate) fn engine_cause(
    model: &str,
    loss_cause: &str,
    reused: u32,
    prompt: u32,
    load_ms: Option<f64>,
) -> EngineCause {
    let kept = match loss_cause {
        "server_empty" => "kept nothing".to_string(),
        "server_head_only" => format!("kept only the head ({reused} of {prompt} tokens)"),
        _ => format!("kept {reused} of {prompt} tokens"),
    };
    if let Some(ms) = load_ms.filter(|ms| *ms >= RELOAD_MS) {
        return EngineCause {
            kind: EngineKind::ModelReload,
            evidence: format!(
                "the server spent {:.0} ms loading the model first and {kept}",
                ms
            ),
        };
    }
    match memory_of(model) {
        Some((kind, family)) => EngineCause {
            kind,
            evidence: format!(
                "{family} ({}): the prompt continued the conversation and nothing ran in between, yet the server {kept}",
                match kind {
                    EngineKind::SlidingWindow => "sliding-window attention, from the model's name",
                    _ => "hybrid or recurrent memory, from the model's name",
                }
            ),
        },
        None => EngineCause {
            kind: EngineKind::Unexplained,
            evidence: format!(
                "the prompt continued the conversation and nothing ran in between, yet the server {kept}"
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_from_the_names_servers_answer_with() {
        for (model, kind) in [
            (
                "models/gemma-3-4b-it-Q4_K_M.gguf",
                Some(EngineKind::SlidingWindow),
            ),
            ("gemma3:4b", Some(EngineKind::SlidingWindow)),
            (
                "/m/gemma-4-E2B-it-qat-UD-Q4_K_XL.gguf",
                Some(EngineKind::SlidingWindow),
            ),
            ("openai/gpt-oss-20b", Some(EngineKind::SlidingWindow)),
            ("Qwen3-Next-80B-A3B.gguf", Some(EngineKind::RecurrentMemory)),
            ("granite-4.0-h-tiny", Some(EngineKind::RecurrentMemory)),
            ("LFM2-1.2B", Some(EngineKind::RecurrentMemory)),
            ("SmolLM2-135M-Instruct.Q4_1.gguf", None),
            ("qwen2.5-coder:7b", None),
            ("", None),
        ] {
            assert_eq!(memory_of(model).map(|(k, _)| k), kind, "{model}");
        }
    }

    #[test]
    fn a_reload_outranks_the_name_and_nothing_named_is_unexplained() {
        let reload = engine_cause("gemma3:4b", "server_empty", 0, 900, Some(2_400.0));
        assert_eq!(reload.kind, EngineKind::ModelReload);
        assert!(
            reload.evidence.contains("2400 ms loading"),
            "{}",
            reload.evidence
        );
        let swa = engine_cause("gemma-3-4b.gguf", "server_empty", 3, 900, Some(5.0));
        assert_eq!(swa.kind, EngineKind::SlidingWindow);
        assert!(
            swa.evidence.starts_with("Gemma 3 (sliding-window"),
            "{}",
            swa.evidence
        );
        let other = engine_cause("qwen2.5", "server_head_only", 300, 900, None);
        assert_eq!(other.kind, EngineKind::Unexplained);
        assert!(
            other
                .evidence
                .ends_with("kept only the head (300 of 900 tokens)")
        );
    }
}
