//! Synthetic checkpoints: the exact file layout, tensor names, shapes and BF16 dtype of
//! Llama 3.2 1B Instruct (or of a tiny model of the same architecture), filled with
//! deterministic pseudo-random values. Real weights cannot be downloaded on our machines;
//! these run at exactly the speed of the real ones and load unchanged in transformers.
//!
//! # Why the weights are not plain noise
//!
//! Our GPU chapters keep activations in bf16 (8 bits of mantissa) while the reference and
//! transformers' fp32 run keep 24. With plain random weights, the best and second-best
//! logits are often so close that the rounding alone changes which one wins, and greedy
//! outputs diverge for no fault of the code. So the weights carry one planted circuit
//! whose winner leads by a wide margin:
//!
//! - Tokens are laid out on closed walks ("orbits"). Coordinate 0 of every embedding row
//!   holds the constant [`ANCHOR_VALUE`]; the other coordinates are split into cycles, and
//!   a coordinate permutation `P` moves every coordinate one step along its cycle. The
//!   token after `t` on its orbit has the embedding row `P(row of t)`.
//! - The last layer's MLP holds one unit per cycle coordinate. Its gate reads only the
//!   constant coordinate, so `silu(gate)` is a large, nearly constant positive number and
//!   the unit is linear; its up row reads coordinate `i`, its down column writes `P(i)`.
//!   Together they add about `SUCCESSOR_GAIN · P(h)` to the residual stream.
//! - The LM head is tied to the embedding, so the logit of the successor of the current
//!   token is about `SUCCESSOR_GAIN · |row|²`, far above any other token's.
//!
//! Every other weight is random at a moderate scale, so each sublayer still changes the
//! residual stream by a sizable amount and the intermediate checks stay meaningful; the
//! random part moves the logits, just not the winner. Greedy output therefore walks the
//! orbit of the prompt's last token: many distinct tokens, and the same ones in bf16 and
//! fp32.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use half::bf16;
use rayon::prelude::*;
use safetensors::{Dtype, View};

use crate::config::{LLAMA_3_2_1B_CONFIG_JSON, LlamaConfig};

/// Value of coordinate 0 of every embedding row: the "always on" input of the planted units.
pub const ANCHOR_VALUE: f32 = 3.0;
/// How strongly the planted MLP units push the residual stream toward the successor.
pub const SUCCESSOR_GAIN: f32 = 3.0;
/// Gate weight of the planted units on the anchor coordinate: keeps `silu` in its linear range.
const ANCHOR_GATE: f32 = 8.0;
/// The residual stream's mean square entering the last MLP (the sublayer scales aim for it).
const RESIDUAL_MEAN_SQUARE: f32 = 2.0;
/// Final norm weights are this over `hidden_size`: puts the winning logit in the 20s, like a real model's.
const FINAL_NORM_GAIN: f32 = 30.0;

/// Which synthetic model to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthConfig {
    /// Llama 3.2 1B Instruct's exact config.json (2.47 GB of BF16 weights).
    OneB,
    /// The same architecture and real vocabulary, tiny: hidden 64, 2 layers, 4 heads, 2 KV heads.
    Tiny,
    /// Like `Tiny`, but with a separate `lm_head.weight` and the config written the way
    /// transformers 5 saves it (`rope_parameters`), to test those paths too.
    TinyUntied,
}

impl SynthConfig {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "1b" => Ok(SynthConfig::OneB),
            "tiny" => Ok(SynthConfig::Tiny),
            "tiny-untied" => Ok(SynthConfig::TinyUntied),
            other => anyhow::bail!("unknown synthetic config {other:?} (expected 1b, tiny or tiny-untied)"),
        }
    }

    /// The text of `config.json`.
    pub fn config_json(self) -> String {
        match self {
            SynthConfig::OneB => LLAMA_3_2_1B_CONFIG_JSON.to_string(),
            SynthConfig::Tiny => tiny_config_json(),
            SynthConfig::TinyUntied => tiny_config_json()
                .replace(r#""rope_theta": 500000.0,"#, "")
                .replace(r#""rope_scaling""#, r#""rope_parameters""#)
                .replace(r#""rope_type": "llama3""#, r#""rope_type": "llama3", "rope_theta": 500000.0"#)
                .replace(r#""tie_word_embeddings": true"#, r#""tie_word_embeddings": false"#),
        }
    }
}

fn tiny_config_json() -> String {
    LLAMA_3_2_1B_CONFIG_JSON
        .replace(r#""head_dim": 64"#, r#""head_dim": 16"#)
        .replace(r#""hidden_size": 2048"#, r#""hidden_size": 64"#)
        .replace(r#""intermediate_size": 8192"#, r#""intermediate_size": 128"#)
        .replace(r#""num_attention_heads": 32"#, r#""num_attention_heads": 4"#)
        .replace(r#""num_hidden_layers": 16"#, r#""num_hidden_layers": 2"#)
        .replace(r#""num_key_value_heads": 8"#, r#""num_key_value_heads": 2"#)
}

/// What [`write_checkpoint`] wrote.
pub struct SynthSummary {
    pub tensors: usize,
    pub bytes: u64,
    /// Length of every orbit (greedy output repeats after this many tokens at the earliest).
    pub orbit_length: usize,
}

/// Writes `config.json` and `model.safetensors` for `which` into `out_dir`.
pub fn write_checkpoint(which: SynthConfig, seed: u64, out_dir: &Path) -> Result<SynthSummary> {
    let config_json = which.config_json();
    let config = LlamaConfig::from_json(&config_json)?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    std::fs::write(out_dir.join("config.json"), &config_json)
        .with_context(|| format!("cannot write {}", out_dir.join("config.json").display()))?;

    let plan = Plan::new(&config, seed);
    let tensors = tensor_list(&config, &plan);
    let summary = SynthSummary {
        tensors: tensors.len(),
        bytes: tensors.iter().map(|(_, t)| t.data_len() as u64).sum(),
        orbit_length: plan.cycles.order,
    };
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let path = out_dir.join("model.safetensors");
    safetensors::serialize_to_file(tensors, Some(metadata), &path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(summary)
}

/// The token that follows `token` on its orbit: what greedy decoding of a synthetic
/// checkpoint made with `seed` produces after `token`.
pub fn planted_successor(config: &LlamaConfig, seed: u64, token: u32) -> u32 {
    let plan = Plan::new(config, seed);
    let place = plan.place_of_token[token as usize];
    let (orbit, step) = (place / plan.cycles.order, place % plan.cycles.order);
    plan.token_at_place[orbit * plan.cycles.order + (step + 1) % plan.cycles.order]
}

/// Everything about a synthetic model that is decided before any tensor is written.
struct Plan {
    config: LlamaConfig,
    seed: u64,
    cycles: Cycles,
    /// Token ids in orbit order: orbit `o`, step `k` is `token_at_place[o * order + k]`.
    token_at_place: Vec<u32>,
    place_of_token: Vec<usize>,
}

impl Plan {
    fn new(config: &LlamaConfig, seed: u64) -> Self {
        let cycles = Cycles::new(config.hidden_size - 1, config.vocab_size);
        let token_at_place = shuffled(config.vocab_size, stream_key(seed, "orbits"));
        let mut place_of_token = vec![0; config.vocab_size];
        for (place, &token) in token_at_place.iter().enumerate() {
            place_of_token[token as usize] = place;
        }
        Plan { config: config.clone(), seed, cycles, token_at_place, place_of_token }
    }

    /// Embedding row element: the anchor, or orbit `o`'s base vector moved `k` steps along the cycles.
    fn embedding(&self, token: usize, coord: usize) -> f32 {
        if coord == 0 {
            return ANCHOR_VALUE;
        }
        let place = self.place_of_token[token];
        let (orbit, step) = (place / self.cycles.order, place % self.cycles.order);
        let source = 1 + self.cycles.source(coord - 1, step);
        uniform(stream_key(self.seed, "embed"), (orbit * self.config.hidden_size + source) as u64)
    }
}

/// A permutation of `n` coordinates made of equal cycles of length `order`, a divisor of
/// the vocabulary size, so every orbit closes exactly. Equal lengths matter: with mixed
/// lengths, moving `m` steps would leave whole cycles in place and make distant tokens of
/// one orbit nearly the same vector.
struct Cycles {
    order: usize,
    /// How many coordinates the cycles cover; the rest are fixed points.
    covered: usize,
}

impl Cycles {
    fn new(n: usize, vocab: usize) -> Self {
        let order = orbit_length(n, vocab);
        Cycles { order, covered: n / order * order }
    }

    /// The coordinate whose value arrives at `coord` after `steps` moves.
    fn source(&self, coord: usize, steps: usize) -> usize {
        if self.is_fixed(coord) {
            return coord;
        }
        let start = coord / self.order * self.order;
        start + (coord - start + self.order - steps % self.order) % self.order
    }

    /// Where `coord`'s value goes in one move.
    fn next(&self, coord: usize) -> usize {
        if self.is_fixed(coord) {
            return coord;
        }
        let start = coord / self.order * self.order;
        start + (coord - start + 1) % self.order
    }

    fn is_fixed(&self, coord: usize) -> bool {
        coord >= self.covered
    }
}

/// The longest orbit that divides `vocab` and fits in `n` coordinates while leaving at
/// most a sixteenth of them as fixed points (which every token of an orbit shares).
fn orbit_length(n: usize, vocab: usize) -> usize {
    (1..=n).rev().find(|&length| vocab.is_multiple_of(length) && n % length <= n / 16).unwrap_or(1)
}

/// A tensor whose BF16 bytes are computed when the writer asks for them, one tensor at a
/// time, so the 2.5 GB checkpoint never sits in memory as a whole.
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

    // Output scale of o_proj and down_proj: each of the 2·layers sublayers adds about
    // 1/(2·layers) to the residual stream's mean square (the 1.6 was measured), so the stream
    // ends near a mean square of 2 whatever the depth, and each sublayer stays visible.
    let sublayer = 1.6 / (2.0 * config.num_hidden_layers as f32).sqrt();
    let last = config.num_hidden_layers - 1;
    for layer in 0..config.num_hidden_layers {
        let name = |suffix: &str| format!("model.layers.{layer}.{suffix}.weight");
        let key = |suffix: &str| stream_key(seed, &name(suffix));
        add(name("input_layernorm"), vec![hidden], norm_weights(key("input_layernorm"), 1.0));
        add(name("post_attention_layernorm"), vec![hidden], norm_weights(key("post_attention_layernorm"), 1.0));
        let projection = 1.0 / (hidden as f32).sqrt();
        add(name("self_attn.q_proj"), vec![q_dim, hidden], random(key("q_proj"), projection));
        add(name("self_attn.k_proj"), vec![kv_dim, hidden], random(key("k_proj"), projection));
        add(name("self_attn.v_proj"), vec![kv_dim, hidden], random(key("v_proj"), projection));
        add(name("self_attn.o_proj"), vec![hidden, q_dim], random(key("o_proj"), sublayer / (q_dim as f32).sqrt()));
        let (gate, up, down) = (key("gate_proj"), key("up_proj"), key("down_proj"));
        let down_scale = sublayer / (ffn as f32).sqrt();
        if layer == last {
            add(name("mlp.gate_proj"), vec![ffn, hidden], Box::new(move |i| plan.planted_gate(gate, i)));
            add(name("mlp.up_proj"), vec![ffn, hidden], Box::new(move |i| plan.planted_up(up, i)));
            add(name("mlp.down_proj"), vec![hidden, ffn], Box::new(move |i| plan.planted_down(down, down_scale, i)));
        } else {
            add(name("mlp.gate_proj"), vec![ffn, hidden], random(gate, projection));
            add(name("mlp.up_proj"), vec![ffn, hidden], random(up, projection));
            add(name("mlp.down_proj"), vec![hidden, ffn], random(down, down_scale));
        }
    }
    tensors
}

impl Plan {
    /// Units `0..hidden-1` of the last MLP are planted: unit `u` serves coordinate `u + 1`.
    fn planted_unit(&self, unit: usize) -> Option<usize> {
        let coord = unit + 1;
        (coord < self.config.hidden_size && !self.cycles.is_fixed(unit)).then_some(coord)
    }

    fn planted_gate(&self, key: u64, i: usize) -> f32 {
        let (unit, coord) = (i / self.config.hidden_size, i % self.config.hidden_size);
        match self.planted_unit(unit) {
            Some(_) => {
                if coord == 0 {
                    ANCHOR_GATE / ANCHOR_VALUE
                } else {
                    0.0
                }
            }
            None => uniform(key, i as u64) / (self.config.hidden_size as f32).sqrt(),
        }
    }

    fn planted_up(&self, key: u64, i: usize) -> f32 {
        let (unit, coord) = (i / self.config.hidden_size, i % self.config.hidden_size);
        match self.planted_unit(unit) {
            Some(served) => {
                if coord == served {
                    1.0
                } else {
                    0.0
                }
            }
            None => uniform(key, i as u64) / (self.config.hidden_size as f32).sqrt(),
        }
    }

    fn planted_down(&self, key: u64, scale: f32, i: usize) -> f32 {
        let ffn = self.config.intermediate_size;
        let (coord, unit) = (i / ffn, i % ffn);
        match self.planted_unit(unit) {
            // The unit reading coordinate `c` writes to `P(c)`.
            // Output ≈ silu(ANCHOR_GATE / rms) · weight · h(c) / rms with rms² ≈ RESIDUAL_MEAN_SQUARE.
            Some(served) => {
                if coord == 1 + self.cycles.next(served - 1) {
                    SUCCESSOR_GAIN * RESIDUAL_MEAN_SQUARE / ANCHOR_GATE
                } else {
                    0.0
                }
            }
            None => uniform(key, i as u64) * scale,
        }
    }
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
fn uniform(key: u64, index: u64) -> f32 {
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
fn stream_key(seed: u64, name: &str) -> u64 {
    let mut hash = 0xCBF2_9CE4_8422_2325u64 ^ splitmix64(seed);
    for byte in name.bytes() {
        hash = (hash ^ byte as u64).wrapping_mul(0x0100_0000_01B3);
    }
    hash
}

/// `0..n` in a seeded random order (Fisher–Yates).
fn shuffled(n: usize, key: u64) -> Vec<u32> {
    let mut items: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = (splitmix64(key.wrapping_add(i as u64)) % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orbit_lengths_divide_the_vocabulary_and_fit_the_coordinates() {
        // 1B: one cycle of 2004 covers all but 43 of the 2047 free coordinates.
        assert_eq!(orbit_length(2047, 128_256), 2004);
        // Tiny: five cycles of 12 cover 60 of 63.
        assert_eq!(orbit_length(63, 128_256), 12);
    }

    #[test]
    fn cycles_cover_almost_every_coordinate_and_return_after_order_steps() {
        let cycles = Cycles::new(2047, 128_256);
        let fixed = (0..2047).filter(|&c| cycles.is_fixed(c)).count();
        assert_eq!(fixed, 43);
        for coord in [0, 300, 1001, 2003, 2046] {
            assert_eq!(cycles.source(coord, cycles.order), coord);
            assert_eq!(cycles.source(cycles.next(coord), 1), coord);
        }
    }

    #[test]
    fn the_successor_embedding_is_the_permuted_row() {
        let config = LlamaConfig::from_json(&SynthConfig::Tiny.config_json()).unwrap();
        let plan = Plan::new(&config, 7);
        let token = 1234;
        let next = planted_successor(&config, 7, token) as usize;
        for coord in 1..config.hidden_size {
            let moved_to = 1 + plan.cycles.next(coord - 1);
            assert_eq!(plan.embedding(token as usize, coord), plan.embedding(next, moved_to));
        }
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
        assert!(SynthConfig::parse("7b").is_err());
        let untied = LlamaConfig::from_json(&SynthConfig::TinyUntied.config_json()).unwrap();
        let tied = LlamaConfig::from_json(&SynthConfig::Tiny.config_json()).unwrap();
        assert!(!untied.tie_word_embeddings && tied.tie_word_embeddings);
        assert_eq!(untied.rope, tied.rope, "rope_parameters must mean the same as rope_theta + rope_scaling");
    }
}
