//! `config.json` for the Llama 3 family, as Hugging Face publishes it.
//!
//! Two spellings of the RoPE settings exist in the wild and both are accepted:
//! the published Llama 3.x files write `rope_theta` plus a `rope_scaling` object,
//! while transformers 5 saves a single `rope_parameters` object holding both.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;

/// The shape and constants of one Llama 3 family model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub rope: RopeConfig,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// Rotary position embedding settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    /// `None` for plain RoPE; `Some` for Llama 3's frequency scaling.
    pub llama3_scaling: Option<Llama3Scaling>,
}

/// The `rope_type: "llama3"` frequency scaling: slow frequencies are divided by
/// `factor`, fast ones kept, and the band in between blended smoothly.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// The fields of `config.json` as written on disk; turned into [`LlamaConfig`] after checks.
#[derive(Deserialize)]
struct RawConfig {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: f32,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRopeParameters>,
    rope_parameters: Option<RawRopeParameters>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<OneOrMany>,
}

#[derive(Deserialize)]
struct RawRopeParameters {
    /// Older files say `type`, newer ones `rope_type`.
    #[serde(alias = "type")]
    rope_type: Option<String>,
    rope_theta: Option<f64>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

impl LlamaConfig {
    /// Reads and checks `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::from_json(&text).with_context(|| format!("{} is not a usable Llama config", path.display()))
    }

    /// Parses and checks the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text).context("invalid config JSON")?;
        let num_key_value_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        ensure!(raw.num_attention_heads > 0, "num_attention_heads must be positive");
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / raw.num_attention_heads);
        let config = LlamaConfig {
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size: raw.vocab_size,
            rms_norm_eps: raw.rms_norm_eps,
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings,
            rope: rope_config(raw.rope_theta, raw.rope_scaling, raw.rope_parameters)?,
            bos_token_id: raw.bos_token_id,
            eos_token_ids: match raw.eos_token_id {
                None => Vec::new(),
                Some(OneOrMany::One(id)) => vec![id],
                Some(OneOrMany::Many(ids)) => ids,
            },
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        for (name, value) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            ensure!(value > 0, "{name} must be positive");
        }
        ensure!(
            self.num_attention_heads.is_multiple_of(self.num_key_value_heads),
            "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
            self.num_attention_heads,
            self.num_key_value_heads
        );
        ensure!(self.head_dim.is_multiple_of(2), "head_dim ({}) must be even for RoPE", self.head_dim);
        ensure!(self.rms_norm_eps > 0.0, "rms_norm_eps must be positive");
        Ok(())
    }

    /// Width of all query heads together (`num_attention_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of all key (or value) heads together (`num_key_value_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// How many query heads share one key/value head.
    pub fn group_size(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}

fn rope_config(
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRopeParameters>,
    rope_parameters: Option<RawRopeParameters>,
) -> Result<RopeConfig> {
    // transformers 5 keeps everything in `rope_parameters`; older files split it.
    let (theta, scaling) = match rope_parameters {
        Some(params) => (params.rope_theta.or(rope_theta), Some(params)),
        None => (rope_theta, rope_scaling),
    };
    let theta = theta.unwrap_or(10_000.0);
    ensure!(theta > 1.0, "rope_theta must be greater than 1");
    let llama3_scaling = match scaling {
        None => None,
        Some(params) => match params.rope_type.as_deref() {
            None | Some("default") => None,
            Some("llama3") => Some(llama3_scaling(&params)?),
            Some(other) => bail!("unsupported rope_type {other:?} (only \"default\" and \"llama3\")"),
        },
    };
    Ok(RopeConfig { theta, llama3_scaling })
}

fn llama3_scaling(params: &RawRopeParameters) -> Result<Llama3Scaling> {
    let missing = |field: &str| anyhow::anyhow!("rope_type llama3 needs {field}");
    let scaling = Llama3Scaling {
        factor: params.factor.ok_or_else(|| missing("factor"))?,
        low_freq_factor: params.low_freq_factor.ok_or_else(|| missing("low_freq_factor"))?,
        high_freq_factor: params.high_freq_factor.ok_or_else(|| missing("high_freq_factor"))?,
        original_max_position_embeddings: params
            .original_max_position_embeddings
            .ok_or_else(|| missing("original_max_position_embeddings"))?,
    };
    ensure!(scaling.factor >= 1.0, "rope factor must be at least 1");
    ensure!(scaling.high_freq_factor > scaling.low_freq_factor, "high_freq_factor must exceed low_freq_factor");
    Ok(scaling)
}

/// The `config.json` of meta-llama/Llama-3.2-1B-Instruct, as published.
pub const LLAMA_3_2_1B_CONFIG_JSON: &str = r#"{
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [
    128001,
    128008,
    128009
  ],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_published_1b_config() {
        let config = LlamaConfig::from_json(LLAMA_3_2_1B_CONFIG_JSON).unwrap();
        assert_eq!(config.hidden_size, 2048);
        assert_eq!(config.num_hidden_layers, 16);
        assert_eq!((config.num_attention_heads, config.num_key_value_heads), (32, 8));
        assert_eq!((config.head_dim, config.group_size()), (64, 4));
        assert_eq!(config.vocab_size, 128_256);
        assert!(config.tie_word_embeddings);
        assert_eq!(config.eos_token_ids, vec![128_001, 128_008, 128_009]);
        assert_eq!(config.rope.theta, 500_000.0);
        let scaling = config.rope.llama3_scaling.unwrap();
        assert_eq!(scaling.factor, 32.0);
        assert_eq!(scaling.original_max_position_embeddings, 8192);
    }

    #[test]
    fn reads_transformers_5_rope_parameters() {
        let json = LLAMA_3_2_1B_CONFIG_JSON
            .replace(r#""rope_theta": 500000.0,"#, "")
            .replace(r#""rope_scaling""#, r#""rope_parameters""#)
            .replace(r#""rope_type": "llama3""#, r#""rope_type": "llama3", "rope_theta": 500000.0"#);
        let config = LlamaConfig::from_json(&json).unwrap();
        let published = LlamaConfig::from_json(LLAMA_3_2_1B_CONFIG_JSON).unwrap();
        assert_eq!(config, published);
    }

    #[test]
    fn default_rope_has_no_scaling_and_head_dim_is_derived() {
        let json = r#"{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 10, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32, "rope_theta": 10000.0, "rope_scaling": null,
            "eos_token_id": 2}"#;
        let config = LlamaConfig::from_json(json).unwrap();
        assert_eq!(config.head_dim, 16);
        assert_eq!(config.num_key_value_heads, 4);
        assert!(config.rope.llama3_scaling.is_none());
        assert!(!config.tie_word_embeddings);
        assert_eq!(config.eos_token_ids, vec![2]);
    }

    #[test]
    fn rejects_unsupported_rope_types_and_bad_head_groups() {
        let yarn = LLAMA_3_2_1B_CONFIG_JSON.replace(r#""rope_type": "llama3""#, r#""rope_type": "yarn""#);
        let err = LlamaConfig::from_json(&yarn).unwrap_err();
        assert!(format!("{err:#}").contains("unsupported rope_type \"yarn\""), "{err:#}");

        let bad_groups = LLAMA_3_2_1B_CONFIG_JSON.replace(r#""num_key_value_heads": 8"#, r#""num_key_value_heads": 5"#);
        let err = LlamaConfig::from_json(&bad_groups).unwrap_err();
        assert!(format!("{err:#}").contains("multiple of num_key_value_heads"), "{err:#}");

        let err = LlamaConfig::from_json("{ not json").unwrap_err();
        assert!(format!("{err:#}").contains("invalid config JSON"), "{err:#}");
    }
}
