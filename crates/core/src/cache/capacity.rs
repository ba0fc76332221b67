//! Cache sizes as users give them: tokens (`65536`, `64K`, `1M`), blocks (`2048b`) or bytes
//! (`16GiB`, `512MB`) with a KV cost per token. Everything rounds down to whole blocks, as
//! kvcache-simulator's `floor(GiB × 2^30 / (bytes_per_token × block_size))` does.

use super::Capacity;

/// KV cache bytes per token of a few models, as kvcache-simulator's catalog has them.
pub(crate) const KV_MODELS: [(&str, u64); 3] = [
    // 78 layers × (512 + 64) × 2 bytes (MLA latent) + 21 × 128 × 2 (DSA indexer)
    ("glm-5.2", 95_232),
    // 32 layers × 8 KV heads × 128 × 2 (K and V) × 2 bytes
    ("llama-3.1-8b", 131_072),
    ("kimi-k2.5", 70_272),
];

pub fn kv_model_bytes_per_token(name: &str) -> Option<u64> {
    KV_MODELS
        .iter()
        .find(|(model, _)| model.eq_ignore_ascii_case(name))
        .map(|&(_, bytes)| bytes)
}

/// llmtrafficlens's default curve: 16K, 64K, 256K, 1M, 4M, 16M tokens.
pub const DEFAULT_CAPACITIES: [&str; 6] = ["16K", "64K", "256K", "1M", "4M", "16M"];

/// Parses one capacity. `bytes_per_token` is needed for byte sizes only.
pub fn parse_capacity(
    text: &str,
    block_size: u32,
    bytes_per_token: Option<u64>,
) -> Result<Capacity, String> {
    let t = text.trim();
    let number_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(number_end);
    let value: f64 = number
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("{text:?} is not a capacity (e.g. 64K, 1M, 2048b, 16GiB)"))?;
    let block_size = u64::from(block_size.max(1));
    let binary = |power: i32| value * 1024f64.powi(power);
    enum Unit {
        Tokens(f64),
        Blocks(f64),
        Bytes(f64),
    }
    let amount = match unit {
        "" => Unit::Tokens(value),
        "b" => Unit::Blocks(value),
        "B" => Unit::Bytes(value),
        _ => match unit.to_ascii_lowercase().as_str() {
            "k" => Unit::Tokens(binary(1)),
            "m" => Unit::Tokens(binary(2)),
            "g" => Unit::Tokens(binary(3)),
            "kib" | "kb" => Unit::Bytes(binary(1)),
            "mib" | "mb" => Unit::Bytes(binary(2)),
            "gib" | "gb" => Unit::Bytes(binary(3)),
            "tib" | "tb" => Unit::Bytes(binary(4)),
            _ => return Err(format!("unknown unit {unit:?} in capacity {text:?}")),
        },
    };
    let (blocks, label) = match amount {
        Unit::Tokens(tokens) => ((tokens.floor() as u64) / block_size, format!("{t} tokens")),
        Unit::Blocks(blocks) => (
            blocks.floor() as u64,
            format!("{} blocks", blocks.floor() as u64),
        ),
        Unit::Bytes(bytes) => {
            let per_token = bytes_per_token.ok_or_else(|| {
                format!("capacity {text:?} is in bytes: give --bytes-per-token or --kv-model")
            })?;
            (
                (bytes.floor() as u64) / (per_token.max(1) * block_size),
                t.to_string(),
            )
        }
    };
    if blocks == 0 {
        return Err(format!(
            "capacity {text:?} is less than one block of {block_size} tokens"
        ));
    }
    Ok(Capacity { blocks, label })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_blocks_and_bytes() {
        let blocks =
            |text: &str, bytes: Option<u64>| parse_capacity(text, 512, bytes).map(|c| c.blocks);
        assert_eq!(blocks("64K", None), Ok(128));
        assert_eq!(blocks("1M", None), Ok(2048));
        assert_eq!(blocks("65536", None), Ok(128));
        assert_eq!(blocks("1000", None), Ok(1)); // rounds down to whole blocks
        assert_eq!(blocks("2048b", None), Ok(2048));
        // 16 GiB of GLM-5.2 at 512-token blocks: floor(16 × 2^30 / (95,232 × 512)).
        assert_eq!(
            blocks("16GiB", kv_model_bytes_per_token("glm-5.2")),
            Ok(352)
        );
        assert!(blocks("16GiB", None).is_err());
        assert!(blocks("100", None).is_err());
        assert!(blocks("12 parsecs", None).is_err());
        assert_eq!(
            parse_capacity("64K", 16, None).map(|c| c.label),
            Ok("64K tokens".to_string())
        );
    }
}
