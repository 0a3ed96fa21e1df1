//! `config.json`: the model's shape, as Hugging Face publishes it next to the weights.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;

/// The most tokens this engine processes for one sequence, prompt and generated tokens
/// together; the model's `max_position_embeddings` may allow fewer.
pub const MAX_CONTEXT: usize = 2048;

// ANCHOR: config
/// The numbers that fix every tensor's shape, plus the constants later chapters need.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    /// The model's family, which must be `"llama"`: other families (Mistral, Qwen2, …) carry
    /// the same fields but compute something else.
    #[serde(default)]
    pub model_type: String,
    #[serde(default)]
    pub architectures: Vec<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Absent from some configs, where it is `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Published files write `rope_theta` and `rope_scaling`; transformers 5 saves both
    /// inside `rope_parameters`. [`Config::from_file`] folds the second form into the first.
    pub rope_theta: Option<f64>,
    #[serde(alias = "rope_parameters")]
    pub rope_scaling: Option<RopeScaling>,
    /// The tokens that end generation: one id or a list; [`Config::from_file`] fills in
    /// Llama 3's three when the file has none.
    #[serde(default, deserialize_with = "one_or_many")]
    pub eos_token_id: Vec<u32>,
}

/// The largest vocabulary accepted (Llama 3 has 128,256 tokens): a bound that keeps a
/// corrupt `vocab_size` from sizing buffers.
pub const MAX_VOCAB: usize = 1 << 20;

/// Llama 3's end tokens: `<|end_of_text|>`, `<|eom_id|>` (end of a tool-call message) and
/// `<|eot_id|>` (end of a turn, what a chat model writes when its answer is done).
pub const LLAMA3_EOS_TOKEN_IDS: [u32; 3] = [128_001, 128_008, 128_009];

/// Llama 3's RoPE frequency scaling (`"rope_type": "llama3"`), explained in chapter 5.
/// The numbers are absent (zero here) when `rope_type` is `"default"`: no scaling.
#[derive(Debug, Clone, Deserialize)]
pub struct RopeScaling {
    pub rope_type: String,
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub factor: f64,
    #[serde(default)]
    pub low_freq_factor: f64,
    #[serde(default)]
    pub high_freq_factor: f64,
    #[serde(default)]
    pub original_max_position_embeddings: usize,
}
// ANCHOR_END: config

impl Config {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut config: Config =
            serde_json::from_str(&text).with_context(|| format!("{} is not a valid Llama config", path.display()))?;
        if config.head_dim == 0 && config.num_attention_heads > 0 {
            config.head_dim = config.hidden_size / config.num_attention_heads;
        }
        if config.rope_theta.is_none() {
            config.rope_theta = config.rope_scaling.as_ref().and_then(|s| s.rope_theta);
        }
        if config.rope_scaling.as_ref().is_some_and(|s| s.rope_type == "default") {
            config.rope_scaling = None;
        }
        if config.eos_token_id.is_empty() {
            config.eos_token_id = LLAMA3_EOS_TOKEN_IDS.to_vec();
        }
        config.validate().with_context(|| format!("{} is not a usable Llama config", path.display()))?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        ensure!(
            self.model_type == "llama",
            "model_type is {:?}: this engine runs Llama models (\"llama\") only",
            self.model_type
        );
        if let Some(other) = self.architectures.iter().find(|a| a.as_str() != "LlamaForCausalLM") {
            bail!("architectures names {other:?}: this engine runs LlamaForCausalLM only");
        }
        for (field, value) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
        ] {
            ensure!(value > 0, "{field} is 0");
        }
        // Refused before anything is sized from it: a table of 10^12 rows would be asked for.
        ensure!(
            self.vocab_size <= MAX_VOCAB,
            "vocab_size {} is beyond the {MAX_VOCAB} this engine allows",
            self.vocab_size
        );
        ensure!(
            self.num_key_value_heads > 0 && self.num_attention_heads.is_multiple_of(self.num_key_value_heads),
            "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
            self.num_attention_heads,
            self.num_key_value_heads
        );
        ensure!(self.rope_theta.is_some(), "rope_theta is missing");
        if let Some(scaling) = &self.rope_scaling {
            if scaling.rope_type != "llama3" {
                bail!("unsupported rope_type {:?}: this engine implements \"llama3\"", scaling.rope_type);
            }
            ensure!(
                scaling.factor >= 1.0 && scaling.high_freq_factor > scaling.low_freq_factor,
                "rope_type llama3 needs factor >= 1 and high_freq_factor > low_freq_factor"
            );
        }
        Ok(())
    }

    /// One line describing the model, for the run's header.
    pub fn summary(&self) -> String {
        format!(
            "hidden {}, {} layers, {} query heads / {} KV heads of {}, FFN {}, vocab {}, {} embeddings",
            self.hidden_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.intermediate_size,
            self.vocab_size,
            if self.tie_word_embeddings { "tied" } else { "untied" }
        )
    }

    /// One line with the constants later chapters use.
    pub fn constants(&self) -> String {
        let rope = match &self.rope_scaling {
            Some(s) => format!(
                "llama3 scaling (factor {}, low {}, high {}, original context {})",
                s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings
            ),
            None => "no scaling".to_string(),
        };
        let eos: Vec<String> = self.eos_token_id.iter().map(u32::to_string).collect();
        format!(
            "rope_theta {} with {rope}, rms_norm_eps {:e}, max positions {}, end tokens {}",
            self.rope_theta.unwrap_or_default(),
            self.rms_norm_eps,
            self.max_position_embeddings,
            eos.join(" ")
        )
    }
}

/// `eos_token_id` is a single id in some files and a list in others (Llama 3.2 Instruct).
fn one_or_many<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(u32),
        Many(Vec<u32>),
    }
    Ok(match Option::<OneOrMany>::deserialize(deserializer)? {
        None => Vec::new(),
        Some(OneOrMany::One(id)) => vec![id],
        Some(OneOrMany::Many(ids)) => ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use llama_reference::config::LLAMA_3_2_1B_CONFIG_JSON;

    /// Llama 3.2 1B's config.json with its `eos_token_id` line replaced by `eos` (or removed).
    fn config_with_eos(eos: Option<&str>) -> Config {
        let text: String = LLAMA_3_2_1B_CONFIG_JSON
            .split_inclusive('\n')
            .scan(false, |in_eos, line| {
                // The list spans several lines: skip from its key to its closing bracket.
                if line.contains("\"eos_token_id\"") {
                    *in_eos = !line.contains(']') && line.contains('[');
                    return Some(eos.map(|e| format!("  \"eos_token_id\": {e},\n")).unwrap_or_default());
                }
                if *in_eos {
                    *in_eos = !line.contains(']');
                    return Some(String::new());
                }
                Some(line.to_string())
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, text).unwrap();
        Config::from_file(&path).unwrap()
    }

    /// Llama 3.2 1B's config.json with `from` replaced by `to`, read back.
    fn edited_config(from: &str, to: &str) -> Result<Config> {
        assert!(LLAMA_3_2_1B_CONFIG_JSON.contains(from), "{from}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, LLAMA_3_2_1B_CONFIG_JSON.replace(from, to)).unwrap();
        Config::from_file(&path)
    }

    #[test]
    fn another_model_family_is_refused() {
        let error =
            format!("{:#}", edited_config("\"model_type\": \"llama\"", "\"model_type\": \"qwen2\"").unwrap_err());
        assert!(error.contains("model_type is \"qwen2\": this engine runs Llama models"), "{error}");
        let error = format!("{:#}", edited_config("\"LlamaForCausalLM\"", "\"MistralForCausalLM\"").unwrap_err());
        assert!(error.contains("architectures names \"MistralForCausalLM\""), "{error}");
    }

    #[test]
    fn a_zero_size_or_a_huge_vocabulary_is_named() {
        let error =
            format!("{:#}", edited_config("\"num_attention_heads\": 32", "\"num_attention_heads\": 0").unwrap_err());
        assert!(error.contains("num_attention_heads is 0"), "{error}");
        let error =
            format!("{:#}", edited_config("\"intermediate_size\": 8192", "\"intermediate_size\": 0").unwrap_err());
        assert!(error.contains("intermediate_size is 0"), "{error}");
        let huge = edited_config("\"vocab_size\": 128256", "\"vocab_size\": 1000000000000").unwrap_err();
        assert!(format!("{huge:#}").contains("vocab_size 1000000000000 is beyond"), "{huge:#}");
    }

    #[test]
    fn end_tokens_come_from_the_file_one_or_many_or_llama3s_three() {
        assert_eq!(config_with_eos(Some("[128001, 128008, 128009]")).eos_token_id, [128_001, 128_008, 128_009]);
        assert_eq!(config_with_eos(Some("2")).eos_token_id, [2]);
        assert_eq!(config_with_eos(None).eos_token_id, LLAMA3_EOS_TOKEN_IDS);
    }
}
