//! Synthetic checkpoints: the exact file layout, tensor names, shapes and BF16 dtype of
//! Llama 3.2 1B Instruct, Llama 3.2 3B Instruct or Llama 3.1 8B Instruct (or of a tiny model
//! of the same architecture), filled with deterministic pseudo-random values, and split into
//! shard files as the real downloads are ([`shards`]). Real weights cannot be downloaded on
//! our machines; these run at exactly the speed of the real ones and load unchanged in
//! transformers. With [`SynthOptions::layers`] they keep the widths but drop layers, for
//! reference checks that take seconds instead of minutes.
//!
//! # Why the weights are not plain noise
//!
//! Our GPU chapters keep activations in bf16 (8 bits of mantissa) while the reference and
//! transformers' fp32 run keep 24. With plain random weights, the best and second-best
//! logits are often so close that the rounding alone changes which one wins, and greedy
//! outputs diverge for no fault of the code. And a test model whose output did not depend
//! on the prompt, or on positions far back, could not tell a correct KV cache from one that
//! reads a stale entry, a wrong position or another request's pages.
//!
//! So layer 0's attention holds a planted circuit ([`circuit`]): attention heads that look
//! fixed distances back through RoPE and echo the loud tokens they find. Greedy output then
//! follows a rule that depends on the prompt's words, on the token 40 positions back, and
//! on every position's RoPE angle, with margins wide enough that bf16 and fp32 agree; some
//! prompts end with `<|eot_id|>` after 20 tokens. [`Circuit::greedy`] predicts it exactly.
//! Every other weight is random at a moderate scale, so each sublayer still changes the
//! residual stream by a sizable amount and every intermediate check stays meaningful.

pub mod circuit;
pub mod shards;

use std::borrow::Cow;
use std::path::Path;

use anyhow::{Context, Result};
use half::bf16;
use rayon::prelude::*;
use safetensors::{Dtype, View};

use crate::config::{LLAMA_3_2_1B_CONFIG_JSON, LlamaConfig};
pub use circuit::Circuit;
use circuit::{BEGIN_OF_TEXT, Layout, PLANTED_CONTEXT, SCORE_MARGIN, SPECIAL_TOKENS_START};

/// Which synthetic model to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthConfig {
    /// Llama 3.2 1B Instruct's exact config.json (2.47 GB of BF16 weights, one file).
    OneB,
    /// Llama 3.2 3B Instruct's exact config.json (6.43 GB, two shards): head size 128 and
    /// groups of 3 query heads per KV head.
    ThreeB,
    /// Llama 3.1 8B Instruct's exact config.json (16.06 GB, four shards): an untied LM head
    /// and RoPE scaled by 8 instead of 32.
    EightB,
    /// The same architecture, head size and real vocabulary, small: hidden 512, 2 layers,
    /// 8 query heads and 2 KV heads of 64 (the 1B model's group of 4), FFN 1024.
    Tiny,
    /// Like `Tiny`, but with a separate `lm_head.weight` and the config written the way
    /// transformers 5 saves it (`rope_parameters`), to test those paths too.
    TinyUntied,
}

impl SynthConfig {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "1b" => Ok(SynthConfig::OneB),
            "3b" => Ok(SynthConfig::ThreeB),
            "8b" => Ok(SynthConfig::EightB),
            "tiny" => Ok(SynthConfig::Tiny),
            "tiny-untied" => Ok(SynthConfig::TinyUntied),
            other => anyhow::bail!("unknown synthetic config {other:?} (expected 1b, 3b, 8b, tiny or tiny-untied)"),
        }
    }

    /// The text of `config.json`, with all of the model's layers.
    pub fn config_json(self) -> String {
        match self {
            SynthConfig::OneB => LLAMA_3_2_1B_CONFIG_JSON.to_string(),
            SynthConfig::ThreeB => LLAMA_3_2_3B_CONFIG_JSON.to_string(),
            SynthConfig::EightB => LLAMA_3_1_8B_CONFIG_JSON.to_string(),
            SynthConfig::Tiny => tiny_config_json(),
            SynthConfig::TinyUntied => tiny_config_json()
                .replace(r#""rope_theta": 500000.0,"#, "")
                .replace(r#""rope_scaling""#, r#""rope_parameters""#)
                .replace(r#""rope_type": "llama3""#, r#""rope_type": "llama3", "rope_theta": 500000.0"#)
                .replace(r#""tie_word_embeddings": true"#, r#""tie_word_embeddings": false"#),
        }
    }

    /// The text of `config.json` as [`write_checkpoint_with`] writes it: with
    /// `options.layers`, `num_hidden_layers` says that many (at least 1, since layer 0 holds
    /// the planted circuit, and at most the model's own count).
    pub fn config_json_with(self, options: &SynthOptions) -> Result<String> {
        let json = self.config_json();
        let Some(layers) = options.layers else { return Ok(json) };
        let all = LlamaConfig::from_json(&json)?.num_hidden_layers;
        anyhow::ensure!(
            (1..=all).contains(&layers),
            "the layer count must be from 1 (layer 0 holds the planted circuit) to {all}, the {self:?} model's own; got {layers}"
        );
        let (from, to) = (format!(r#""num_hidden_layers": {all},"#), format!(r#""num_hidden_layers": {layers},"#));
        anyhow::ensure!(json.matches(&from).count() == 1, "the {self:?} config does not spell {from} once");
        Ok(json.replace(&from, &to))
    }

    /// The largest shard of the real download; `None` where it is one `model.safetensors`.
    fn download_shard_bytes(self) -> Option<u64> {
        match self {
            SynthConfig::ThreeB | SynthConfig::EightB => Some(shards::HUGGING_FACE_SHARD_BYTES),
            SynthConfig::OneB | SynthConfig::Tiny | SynthConfig::TinyUntied => None,
        }
    }
}

/// The `config.json` of meta-llama/Llama-3.2-3B-Instruct, as published.
const LLAMA_3_2_3B_CONFIG_JSON: &str = r#"{
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
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 3072,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 24,
  "num_hidden_layers": 28,
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

/// The `config.json` of meta-llama/Llama-3.1-8B-Instruct, as published: no `head_dim`
/// (it is `hidden_size / num_attention_heads` = 128), an untied LM head and RoPE scaled by 8.
const LLAMA_3_1_8B_CONFIG_JSON: &str = r#"{
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
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}
"#;

fn tiny_config_json() -> String {
    LLAMA_3_2_1B_CONFIG_JSON
        .replace(r#""hidden_size": 2048"#, r#""hidden_size": 512"#)
        .replace(r#""intermediate_size": 8192"#, r#""intermediate_size": 1024"#)
        .replace(r#""num_attention_heads": 32"#, r#""num_attention_heads": 8"#)
        .replace(r#""num_hidden_layers": 16"#, r#""num_hidden_layers": 2"#)
        .replace(r#""num_key_value_heads": 8"#, r#""num_key_value_heads": 2"#)
}

/// How to write a synthetic checkpoint, beyond which model and seed.
#[derive(Debug, Clone, Copy, Default)]
pub struct SynthOptions {
    /// Write only this many layers (same widths), for fast reference checks. The checkpoint
    /// is then a model of that many layers in its own right: the random layers' scale
    /// follows the layer count, as it does for every model.
    pub layers: Option<usize>,
    /// Split into shards of at most this many bytes of tensor data, with an index file;
    /// `None`: the real download's layout (one file for 1B and the tiny models, 5 GB shards for 3B and 8B).
    pub shard_bytes: Option<u64>,
}

/// What [`write_checkpoint_with`] wrote.
#[derive(Debug)]
pub struct SynthSummary {
    pub tensors: usize,
    pub bytes: u64,
    /// Number of safetensors files: 1 for `model.safetensors`, else the shards.
    pub files: usize,
    /// Layers written: the model's own count, or [`SynthOptions::layers`].
    pub layers: usize,
    /// Length of every orbit of the planted circuit.
    pub orbit_length: usize,
}

/// Writes `config.json` and the weights of `which` into `out_dir`, laid out as the real
/// download is.
pub fn write_checkpoint(which: SynthConfig, seed: u64, out_dir: &Path) -> Result<SynthSummary> {
    write_checkpoint_with(which, seed, out_dir, &SynthOptions::default())
}

/// Writes `config.json` and the weights of `which` into `out_dir`: one `model.safetensors`,
/// or shards and `model.safetensors.index.json` (see [`shards`]). Weight files an earlier
/// write left in `out_dir` are removed first, so the folder never holds two layouts.
pub fn write_checkpoint_with(
    which: SynthConfig,
    seed: u64,
    out_dir: &Path,
    options: &SynthOptions,
) -> Result<SynthSummary> {
    let config_json = which.config_json_with(options)?;
    let config = LlamaConfig::from_json(&config_json)?;
    let shard_bytes = options.shard_bytes.or(which.download_shard_bytes());
    anyhow::ensure!(shard_bytes != Some(0), "the shard size must be positive");
    let plan = Plan::new(&config, seed)?;

    std::fs::create_dir_all(out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    shards::remove_old_weights(out_dir)?;
    std::fs::write(out_dir.join("config.json"), &config_json)
        .with_context(|| format!("cannot write {}", out_dir.join("config.json").display()))?;
    let tensors = tensor_list(&config, &plan);
    let tensor_count = tensors.len();
    let written = shards::write(tensors, shard_bytes, out_dir)?;
    Ok(SynthSummary {
        tensors: tensor_count,
        bytes: written.bytes,
        files: written.files,
        layers: config.num_hidden_layers,
        orbit_length: plan.circuit.orbit_length(),
    })
}

/// Value of the anchor coordinate of every row but `<|begin_of_text|>`'s.
pub const ANCHOR_VALUE: f32 = 3.0;
/// The loudness coordinate: `+LOUDNESS_VALUE` for loud tokens, `-LOUDNESS_VALUE` for quiet ones.
pub const LOUDNESS_VALUE: f32 = 3.0;
/// The share of a row's energy (sum of squares) on its echo coordinates; the rest, after
/// the anchor and loudness, is filler.
const ECHO_SHARE: f32 = 0.75;
/// Final norm weights are this over `hidden_size`: puts the winning logit near 20, like a real model's.
const FINAL_NORM_GAIN: f32 = 30.0;

/// Everything about a synthetic model that is decided before any tensor is written.
struct Plan {
    config: LlamaConfig,
    seed: u64,
    circuit: Circuit,
    /// Norm of every orbit's echo vector before scaling, and of every token's filler.
    orbit_norms: Vec<f32>,
    off_orbit_norms: Vec<f32>,
    filler_norms: Vec<f32>,
    /// Layer 0's input_layernorm weights as stored (bf16), which the planted weights undo.
    layer0_norm: Vec<f32>,
    scores: Scores,
}

/// The attention scores (softmax units) the planted heads are built for.
struct Scores {
    /// Height of the positional peak at a head's distance.
    peak: f64,
    /// What a loud key adds (a quiet key adds 0).
    loud: f64,
    /// What `<|begin_of_text|>`'s key scores in a gated head.
    sink: f64,
    /// Each rotary pair's share of the peak.
    profile: Vec<f64>,
    inv_freq: Vec<f64>,
}

impl Scores {
    /// With gap `g` (the peak's lead as a fraction of its height), margin `M`, a peak
    /// `S = 2M/g`, loud keys `+3M` and the sink at `S + 2M`, every case is decided by at
    /// least `M`: a loud target beats the sink and every other key; the sink beats a quiet
    /// target, and every other key, loud or not, when the target is quiet or missing.
    fn new(config: &LlamaConfig) -> Self {
        let inv_freq = circuit::rotary_frequencies(config);
        let profile = circuit::position_profile(&inv_freq);
        let peak = 2.0 * SCORE_MARGIN / circuit::position_gap(&profile, &inv_freq);
        Scores { peak, loud: 3.0 * SCORE_MARGIN, sink: peak + 2.0 * SCORE_MARGIN, profile, inv_freq }
    }

    /// The pair that carries content: the slowest, which turns by a few ten-thousandths
    /// of a radian over the planted context (1.3 thousandths in Llama 3.1 8B, whose RoPE is
    /// scaled by 8, not 32), so it all but ignores positions.
    fn content_pair(&self) -> usize {
        self.inv_freq.len() - 1
    }

    /// The largest angle the content pair turns between two positions of the planted context.
    fn content_turn(&self) -> f64 {
        self.inv_freq[self.content_pair()] * PLANTED_CONTEXT as f64
    }

    /// How much the content pair's turn can take off a margin, in softmax units. A content
    /// term `c` between positions `Δ` apart scores `c·cos(Δθ)`, not `c`: RoPE turns the query
    /// and key pairs by their positions and their dot product keeps the cosine of the
    /// difference. So a key's content score drops by at most `c·(1 − cos(turn))`, about
    /// `c·turn²/2`, and the largest content term is the sink's.
    fn content_loss(&self) -> f64 {
        self.sink.max(self.loud) * (1.0 - self.content_turn().cos())
    }
}

impl Plan {
    fn new(config: &LlamaConfig, seed: u64) -> Result<Self> {
        let circuit = Circuit::new(config, seed)?;
        let scores = Scores::new(config);
        // The margins are built for content terms that ignore position. The content pair's
        // turn shrinks them by `content_loss`; allow a hundredth of the margin, which admits
        // turns up to about 0.045 rad (Llama 3.1 8B turns 1.3e-3 rad, costing 1e-4 of the 12).
        anyhow::ensure!(
            scores.content_loss() < SCORE_MARGIN / 100.0,
            "the slowest rotary pair turns {} rad over the planted context, costing {} of the margin {SCORE_MARGIN}",
            scores.content_turn(),
            scores.content_loss()
        );
        let layout = circuit.layout;
        let norm = |values: &dyn Fn(usize) -> f32, len: usize| (0..len).map(|i| values(i).powi(2)).sum::<f32>().sqrt();
        let orbits = SPECIAL_TOKENS_START as usize / layout.echo_len;
        let orbit_norms = (0..orbits)
            .into_par_iter()
            .map(|orbit| {
                norm(&|i| uniform(stream_key(seed, "echo"), (orbit * layout.echo_len + i) as u64), layout.echo_len)
            })
            .collect();
        let off_orbit_norms = (0..config.vocab_size)
            .into_par_iter()
            .map(|t| {
                norm(
                    &|i| uniform(stream_key(seed, "echo off orbit"), (t * layout.echo_len + i) as u64),
                    layout.echo_len,
                )
            })
            .collect();
        let filler_len = layout.hidden - layout.filler_start();
        let filler_norms = (0..config.vocab_size)
            .into_par_iter()
            .map(|t| norm(&|i| uniform(stream_key(seed, "filler"), (t * layout.hidden + i) as u64), filler_len))
            .collect();
        let layer0_key = stream_key(seed, "model.layers.0.input_layernorm.weight");
        let layer0_norm =
            (0..layout.hidden).map(|i| bf16::from_f32(norm_weights(layer0_key, 1.0)(i)).to_f32()).collect();
        Ok(Plan {
            config: config.clone(),
            seed,
            circuit,
            orbit_norms,
            off_orbit_norms,
            filler_norms,
            layer0_norm,
            scores,
        })
    }

    /// Embedding row element. Every row's sum of squares is `hidden`, so RMSNorm divides
    /// every row by exactly 1.
    fn embedding(&self, token: usize, coord: usize) -> f32 {
        let layout = self.circuit.layout;
        if token == BEGIN_OF_TEXT as usize {
            return if coord == Layout::SINK { (layout.hidden as f32).sqrt() } else { 0.0 };
        }
        let fixed = ANCHOR_VALUE.powi(2) + LOUDNESS_VALUE.powi(2);
        let echo_energy = ECHO_SHARE * (layout.hidden as f32 - fixed);
        match coord {
            Layout::ANCHOR => ANCHOR_VALUE,
            Layout::LOUDNESS if self.circuit.is_loud(token as u32) => LOUDNESS_VALUE,
            Layout::LOUDNESS => -LOUDNESS_VALUE,
            Layout::SINK => 0.0,
            c if c < layout.filler_start() => {
                let index = c - layout.echo_start;
                let len = layout.echo_len;
                let (value, norm) = match self.circuit.place(token as u32) {
                    // Orbit `o`'s vector, turned `step` coordinates along the cycle.
                    Some((orbit, step)) => (
                        uniform(stream_key(self.seed, "echo"), (orbit * len + (index + len - step) % len) as u64),
                        self.orbit_norms[orbit],
                    ),
                    None => (
                        uniform(stream_key(self.seed, "echo off orbit"), (token * len + index) as u64),
                        self.off_orbit_norms[token],
                    ),
                };
                value * echo_energy.sqrt() / norm
            }
            c => {
                let filler_energy = layout.hidden as f32 - fixed - echo_energy;
                let value = uniform(
                    stream_key(self.seed, "filler"),
                    (token * layout.hidden + c - layout.filler_start()) as u64,
                );
                value * filler_energy.sqrt() / self.filler_norms[token]
            }
        }
    }

    /// Layer 0's query weights: only the anchor column is used. Pair `i` of a head that
    /// looks `d` back is the constant `√(share·S·√head_dim)·e^(−i·d·θ_i)`; RoPE turns it to
    /// meet the key of the position `d` back in phase. Gated heads also carry `√head_dim` on
    /// the content pair, so that their score adds the key's content term.
    fn layer0_query(&self, i: usize) -> f32 {
        let (row, col) = (i / self.config.hidden_size, i % self.config.hidden_size);
        if col != Layout::ANCHOR {
            return 0.0;
        }
        let head_dim = self.config.head_dim;
        let (head, element) = (row / head_dim, row % head_dim);
        let echo = self.circuit.heads[head % self.config.group_size()];
        let (pair, second) = (element % (head_dim / 2), element >= head_dim / 2);
        let anchor = (ANCHOR_VALUE * self.layer0_norm[Layout::ANCHOR]) as f64;
        let value = if pair == self.scores.content_pair() {
            match (echo.is_gated(), second) {
                (true, false) => (head_dim as f64).sqrt(),
                _ => 0.0,
            }
        } else {
            let phase = -(echo.distance as f64) * self.scores.inv_freq[pair];
            let amplitude = self.pair_amplitude(pair);
            if second { amplitude * phase.sin() } else { amplitude * phase.cos() }
        };
        (value / anchor) as f32
    }

    /// Layer 0's key weights: the positional pairs are constants from the anchor (phase 0);
    /// the content pair is `3M/2` from the anchor plus `±3M/2` from the loudness coordinate
    /// (so loud `3M`, quiet 0), and, for `<|begin_of_text|>` only, the sink score.
    fn layer0_key(&self, i: usize) -> f32 {
        let (row, col) = (i / self.config.hidden_size, i % self.config.hidden_size);
        let head_dim = self.config.head_dim;
        let element = row % head_dim;
        if element >= head_dim / 2 {
            return 0.0;
        }
        let normed = |coord: usize, value: f32| (value * self.layer0_norm[coord]) as f64;
        let value = match (element == self.scores.content_pair(), col) {
            (false, Layout::ANCHOR) => self.pair_amplitude(element) / normed(col, ANCHOR_VALUE),
            (true, Layout::ANCHOR) => self.scores.loud / 2.0 / normed(col, ANCHOR_VALUE),
            (true, Layout::LOUDNESS) => self.scores.loud / 2.0 / normed(col, LOUDNESS_VALUE),
            (true, Layout::SINK) => self.scores.sink / normed(col, (self.config.hidden_size as f32).sqrt()),
            _ => 0.0,
        };
        value as f32
    }

    /// `|q| = |k|` of a positional pair, so that its share of the peak is `q·k / √head_dim`.
    fn pair_amplitude(&self, pair: usize) -> f64 {
        (self.scores.profile[pair] * self.scores.peak * (self.config.head_dim as f64).sqrt()).sqrt()
    }

    /// Layer 0's value weights: key/value head `j` copies echo coordinates `j·head_dim ..`.
    fn layer0_value(&self, i: usize) -> f32 {
        let (row, col) = (i / self.config.hidden_size, i % self.config.hidden_size);
        let echo_coord = self.circuit.layout.echo_start + row;
        if col == echo_coord { 1.0 / self.layer0_norm[col] } else { 0.0 }
    }

    /// Layer 0's output weights: a head's copy of echo coordinate `c` goes to coordinate
    /// `c + 1` of the cycle (so it becomes the successor's), times the head's gain.
    fn layer0_output(&self, i: usize) -> f32 {
        let q_dim = self.config.q_dim();
        let (row, col) = (i / q_dim, i % q_dim);
        let head_dim = self.config.head_dim;
        let (head, element) = (col / head_dim, col % head_dim);
        let kv_head = head / self.config.group_size();
        let echo = self.circuit.heads[head % self.config.group_size()];
        if row == self.circuit.layout.echo(kv_head * head_dim + element, 1) { echo.gain } else { 0.0 }
    }
}

/// A tensor whose BF16 bytes are computed when the writer asks for them, one tensor at a
/// time, so a checkpoint (16 GB for Llama 3.1 8B) never sits in memory as a whole: only
/// the tensor being written does, at most the 1 GB embedding.
struct LazyTensor<'a> {
    shape: Vec<usize>,
    value: Box<dyn Fn(usize) -> f32 + Sync + 'a>,
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::BF16
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let mut bytes = vec![0u8; self.data_len()];
        bytes.par_chunks_mut(2).enumerate().for_each(|(i, out)| {
            out.copy_from_slice(&bf16::from_f32((self.value)(i)).to_le_bytes());
        });
        Cow::Owned(bytes)
    }

    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * 2
    }
}

fn tensor_list<'a>(config: &'a LlamaConfig, plan: &'a Plan) -> Vec<(String, LazyTensor<'a>)> {
    let (hidden, ffn, vocab) = (config.hidden_size, config.intermediate_size, config.vocab_size);
    let (q_dim, kv_dim) = (config.q_dim(), config.kv_dim());
    let seed = plan.seed;
    let mut tensors: Vec<(String, LazyTensor<'a>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, value: Box<dyn Fn(usize) -> f32 + Sync + 'a>| {
        tensors.push((name, LazyTensor { shape, value }));
    };

    add(
        "model.embed_tokens.weight".into(),
        vec![vocab, hidden],
        Box::new(move |i| plan.embedding(i / hidden, i % hidden)),
    );
    if !config.tie_word_embeddings {
        // An untied head close to the embedding, so the planted margins survive, but not
        // equal to it, so reading the wrong matrix changes the logits.
        let key = stream_key(seed, "lm_head");
        add(
            "lm_head.weight".into(),
            vec![vocab, hidden],
            Box::new(move |i| plan.embedding(i / hidden, i % hidden) + 0.05 * uniform(key, i as u64)),
        );
    }
    add(
        "model.norm.weight".into(),
        vec![hidden],
        norm_weights(stream_key(seed, "model.norm"), FINAL_NORM_GAIN / hidden as f32),
    );

    // Output scale of the random o_proj and down_proj: each random sublayer adds about
    // 1/(2·layers) to the mean square of a normalized stream (the 1.6 was measured), so each
    // stays visible and all of them together stay small beside the planted echoes.
    let sublayer = 1.6 / (2.0 * config.num_hidden_layers as f32).sqrt();
    for layer in 0..config.num_hidden_layers {
        let name = |suffix: &str| format!("model.layers.{layer}.{suffix}.weight");
        let key = |suffix: &str| stream_key(seed, &name(suffix));
        add(name("input_layernorm"), vec![hidden], norm_weights(key("input_layernorm"), 1.0));
        add(name("post_attention_layernorm"), vec![hidden], norm_weights(key("post_attention_layernorm"), 1.0));
        let projection = 1.0 / (hidden as f32).sqrt();
        if layer == 0 {
            add(name("self_attn.q_proj"), vec![q_dim, hidden], Box::new(move |i| plan.layer0_query(i)));
            add(name("self_attn.k_proj"), vec![kv_dim, hidden], Box::new(move |i| plan.layer0_key(i)));
            add(name("self_attn.v_proj"), vec![kv_dim, hidden], Box::new(move |i| plan.layer0_value(i)));
            add(name("self_attn.o_proj"), vec![hidden, q_dim], Box::new(move |i| plan.layer0_output(i)));
        } else {
            add(name("self_attn.q_proj"), vec![q_dim, hidden], random(key("q_proj"), projection));
            add(name("self_attn.k_proj"), vec![kv_dim, hidden], random(key("k_proj"), projection));
            add(name("self_attn.v_proj"), vec![kv_dim, hidden], random(key("v_proj"), projection));
            add(name("self_attn.o_proj"), vec![hidden, q_dim], random(key("o_proj"), sublayer / (q_dim as f32).sqrt()));
        }
        add(name("mlp.gate_proj"), vec![ffn, hidden], random(key("gate_proj"), projection));
        add(name("mlp.up_proj"), vec![ffn, hidden], random(key("up_proj"), projection));
        add(name("mlp.down_proj"), vec![hidden, ffn], random(key("down_proj"), sublayer / (ffn as f32).sqrt()));
    }
    tensors
}

/// Uniform values with standard deviation `std`.
fn random<'a>(key: u64, std: f32) -> Box<dyn Fn(usize) -> f32 + Sync + 'a> {
    Box::new(move |i| uniform(key, i as u64) * std)
}

/// Norm weights near `scale`: `scale * (1 ± 10%)`.
fn norm_weights<'a>(key: u64, scale: f32) -> Box<dyn Fn(usize) -> f32 + Sync + 'a> {
    Box::new(move |i| scale * (1.0 + 0.1 * uniform(key, i as u64) / 3f32.sqrt()))
}

/// A value with mean 0 and standard deviation 1 (uniform on ±√3), from a counter-based
/// generator: element `index` of stream `key` is the same whatever order we compute in.
pub(crate) fn uniform(key: u64, index: u64) -> f32 {
    let bits = splitmix64(key ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let unit = (bits >> 40) as f32 / (1u64 << 24) as f32; // in [0, 1)
    (2.0 * unit - 1.0) * 3f32.sqrt()
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stream key from the seed and a name (FNV-1a over the name's bytes).
pub(crate) fn stream_key(seed: u64, name: &str) -> u64 {
    let mut hash = 0xCBF2_9CE4_8422_2325u64 ^ splitmix64(seed);
    for byte in name.bytes() {
        hash = (hash ^ byte as u64).wrapping_mul(0x0100_0000_01B3);
    }
    hash
}

/// `0..n` in a seeded random order (Fisher–Yates).
pub(crate) fn shuffled(n: usize, key: u64) -> Vec<u32> {
    let mut items: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = (splitmix64(key.wrapping_add(i as u64)) % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
    items
}

#[cfg(test)]
mod tests {
    use super::circuit::{DOUBLE_NEWLINE, END_AFTER, END_OF_TURN};
    use super::*;

    fn tiny_plan(seed: u64) -> Plan {
        Plan::new(&LlamaConfig::from_json(&SynthConfig::Tiny.config_json()).unwrap(), seed).unwrap()
    }

    #[test]
    fn the_successor_echo_is_the_row_moved_one_coordinate() {
        let plan = tiny_plan(7);
        let layout = plan.circuit.layout;
        for token in [1234u32, DOUBLE_NEWLINE, 127_999] {
            let Some(next) = plan.circuit.successor(token) else { continue };
            for index in 0..layout.echo_len {
                let (here, there) = (layout.echo(index, 0), layout.echo(index, 1));
                assert_eq!(plan.embedding(token as usize, here), plan.embedding(next as usize, there));
            }
        }
    }

    #[test]
    fn every_row_has_the_same_sum_of_squares() {
        let plan = tiny_plan(3);
        let hidden = plan.config.hidden_size;
        let off_orbit = 128_001;
        for token in [0, 271, 5000, 127_999, BEGIN_OF_TEXT as usize, END_OF_TURN as usize, off_orbit] {
            let energy: f32 = (0..hidden).map(|c| plan.embedding(token, c).powi(2)).sum();
            assert!((energy / hidden as f32 - 1.0).abs() < 1e-4, "token {token}: {energy}");
        }
    }

    #[test]
    fn the_quiet_path_leads_from_double_newline_to_end_of_turn() {
        let circuit = tiny_plan(5).circuit;
        let mut token = DOUBLE_NEWLINE;
        for step in 1..=END_AFTER {
            token = circuit.successor(token).unwrap();
            assert_eq!(token == END_OF_TURN, step == END_AFTER, "step {step}: {token}");
            assert!(!circuit.is_loud(token), "step {step}: {token} is loud");
        }
    }

    #[test]
    fn orbits_hold_every_ordinary_token_but_one_and_end_of_turn() {
        let circuit = tiny_plan(9).circuit;
        let off: Vec<u32> = (0..SPECIAL_TOKENS_START).filter(|&t| circuit.place(t).is_none()).collect();
        assert_eq!(off.len(), 1, "ordinary tokens off the orbits: {off:?}");
        assert!(circuit.place(END_OF_TURN).is_some() && circuit.place(BEGIN_OF_TEXT).is_none());
        // Walking an orbit comes back after exactly its length.
        let mut token = 4321;
        for _ in 0..circuit.orbit_length() {
            token = circuit.successor(token).unwrap();
        }
        assert_eq!(token, 4321);
    }

    #[test]
    fn the_positional_peak_leads_by_a_quarter_within_the_planted_context() {
        let config = LlamaConfig::from_json(&SynthConfig::OneB.config_json()).unwrap();
        let scores = Scores::new(&config);
        let gap = circuit::position_gap(&scores.profile, &scores.inv_freq);
        assert!((0.24..0.25).contains(&gap), "gap {gap}");
        assert!((scores.profile.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // The content pair carries no position.
        assert_eq!(scores.profile[scores.content_pair()], 0.0);
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut items = shuffled(1000, 42);
        items.sort_unstable();
        assert_eq!(items, (0..1000).collect::<Vec<u32>>());
    }

    #[test]
    fn config_names_parse() {
        assert_eq!(SynthConfig::parse("1b").unwrap(), SynthConfig::OneB);
        assert_eq!(SynthConfig::parse("3b").unwrap(), SynthConfig::ThreeB);
        assert_eq!(SynthConfig::parse("8b").unwrap(), SynthConfig::EightB);
        assert!(SynthConfig::parse("7b").is_err());
        let untied = LlamaConfig::from_json(&SynthConfig::TinyUntied.config_json()).unwrap();
        let tied = LlamaConfig::from_json(&SynthConfig::Tiny.config_json()).unwrap();
        assert!(!untied.tie_word_embeddings && tied.tie_word_embeddings);
        assert_eq!(untied.rope, tied.rope, "rope_parameters must mean the same as rope_theta + rope_scaling");
    }

    fn config(which: SynthConfig) -> LlamaConfig {
        LlamaConfig::from_json(&which.config_json()).unwrap()
    }

    #[test]
    fn the_3b_and_8b_configs_are_the_published_shapes() {
        let three = config(SynthConfig::ThreeB);
        assert_eq!((three.hidden_size, three.intermediate_size, three.num_hidden_layers), (3072, 8192, 28));
        assert_eq!((three.num_attention_heads, three.num_key_value_heads, three.head_dim), (24, 8, 128));
        assert!(three.tie_word_embeddings);
        assert_eq!(three.rope.llama3_scaling.unwrap().factor, 32.0);

        let eight = config(SynthConfig::EightB);
        assert!(!SynthConfig::EightB.config_json().contains("head_dim"), "Llama 3.1 8B's config has no head_dim");
        assert_eq!((eight.hidden_size, eight.intermediate_size, eight.num_hidden_layers), (4096, 14336, 32));
        assert_eq!((eight.num_attention_heads, eight.num_key_value_heads, eight.head_dim), (32, 8, 128));
        assert!(!eight.tie_word_embeddings);
        assert_eq!(eight.rope.llama3_scaling.unwrap().factor, 8.0);
        for config in [three, eight] {
            assert_eq!((config.vocab_size, config.max_position_embeddings), (128_256, 131_072));
            assert_eq!(config.rope.theta, 500_000.0);
            assert_eq!(config.eos_token_ids, [128_001, 128_008, 128_009]);
        }
    }

    /// Head size 128 has twice the rotary pairs of 64; the peak still leads by a quarter, and
    /// the content pair of the 8B model (RoPE scaled by 8, not 32, so it turns 4 times as
    /// far as the 3B's) costs about a ten-thousandth of a softmax unit.
    #[test]
    fn head_size_128_keeps_the_positional_gap_and_a_still_content_pair() {
        for (which, turn_below) in [(SynthConfig::ThreeB, 4e-4), (SynthConfig::EightB, 1.3e-3)] {
            let scores = Scores::new(&config(which));
            let gap = circuit::position_gap(&scores.profile, &scores.inv_freq);
            assert!((0.24..0.25).contains(&gap), "{which:?}: gap {gap}");
            assert_eq!(scores.profile[scores.content_pair()], 0.0);
            assert!(scores.content_turn() < turn_below, "{which:?}: turn {}", scores.content_turn());
            assert!(scores.content_loss() < 2e-4, "{which:?}: loss {}", scores.content_loss());
        }
    }

    /// The full 3B and 8B plans (no file written): the circuit fits their groups of 3 and 4
    /// query heads, and Hugging Face's 5 GB rule splits them into the download's 2 and 4 shards.
    #[test]
    fn the_3b_and_8b_plans_hold_and_split_like_the_downloads() {
        let distances = |plan: &Plan| plan.circuit.heads.iter().map(|h| h.distance).collect::<Vec<_>>();
        for (which, heads, bytes, files) in [
            (SynthConfig::ThreeB, vec![0, 6, 40], 6_425_499_648, 2),
            (SynthConfig::EightB, vec![0, 5, 6, 40], 16_060_522_496, 4),
        ] {
            let config = config(which);
            let plan = Plan::new(&config, 1).unwrap();
            assert_eq!(distances(&plan), heads, "{which:?}");
            assert_eq!(plan.circuit.orbit_length(), 1024);
            let sizes: Vec<u64> = tensor_list(&config, &plan).iter().map(|(_, t)| t.data_len() as u64).collect();
            assert_eq!(sizes.iter().sum::<u64>(), bytes, "{which:?}");
            let shards = shards::assign_shards(&sizes, which.download_shard_bytes().unwrap());
            assert_eq!(shards.last().unwrap() + 1, files, "{which:?}");
        }
        assert_eq!(SynthConfig::OneB.download_shard_bytes(), None);
    }

    #[test]
    fn layers_rewrites_only_the_layer_count_within_bounds() {
        let two = SynthOptions { layers: Some(2), ..SynthOptions::default() };
        let json = SynthConfig::EightB.config_json_with(&two).unwrap();
        let mut expected = config(SynthConfig::EightB);
        expected.num_hidden_layers = 2;
        assert_eq!(LlamaConfig::from_json(&json).unwrap(), expected);
        let all = SynthOptions { layers: Some(32), ..SynthOptions::default() };
        assert_eq!(SynthConfig::EightB.config_json_with(&all).unwrap(), SynthConfig::EightB.config_json());
        for layers in [0, 33] {
            let options = SynthOptions { layers: Some(layers), ..SynthOptions::default() };
            let err = SynthConfig::EightB.config_json_with(&options).unwrap_err().to_string();
            assert!(err.contains("from 1") && err.contains("to 32,"), "{err}");
        }
    }
}
