//! The Llama 3 forward pass in plain f32, one public function per step so that each
//! chapter can compare its GPU result with exactly the step it implements.

use std::path::Path;

use anyhow::{Result, ensure};
use rayon::prelude::*;

use crate::checkpoint::Checkpoint;
use crate::config::LlamaConfig;
use crate::rope::{apply_rope, inverse_frequencies};
use crate::tensor::{Matrix, dot, linear};

/// The weights of one decoder layer, in f32, in PyTorch's `[out, in]` layout.
pub struct Layer {
    pub input_layernorm: Vec<f32>,
    pub q_proj: Matrix,
    pub k_proj: Matrix,
    pub v_proj: Matrix,
    pub o_proj: Matrix,
    pub post_attention_layernorm: Vec<f32>,
    pub gate_proj: Matrix,
    pub up_proj: Matrix,
    pub down_proj: Matrix,
}

/// A whole model held in f32.
pub struct Model {
    pub config: LlamaConfig,
    pub embed_tokens: Matrix,
    pub layers: Vec<Layer>,
    pub norm: Vec<f32>,
    /// `None` when the LM head is tied to `embed_tokens`.
    pub lm_head: Option<Matrix>,
    /// Rotary frequency of each pair of a head (after Llama 3 scaling).
    pub inv_freq: Vec<f64>,
}

/// The keys and values of the positions seen so far, for one layer.
/// Keys are stored after RoPE, as `[positions, kv_dim]`.
#[derive(Clone, Default)]
pub struct LayerCache {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

/// Keys and values for every layer: lets greedy decoding feed one token at a time.
pub struct KvCache {
    pub layers: Vec<LayerCache>,
    /// How many positions the cache holds.
    pub len: usize,
}

impl KvCache {
    pub fn new(config: &LlamaConfig) -> Self {
        KvCache { layers: vec![LayerCache::default(); config.num_hidden_layers], len: 0 }
    }
}

impl Model {
    /// Loads `config.json` and the weights from a model directory.
    pub fn load(model_dir: &Path) -> Result<Self> {
        let config = LlamaConfig::from_file(&model_dir.join("config.json"))?;
        let checkpoint = Checkpoint::open(model_dir)?;
        Self::from_checkpoint(config, &checkpoint)
    }

    pub fn from_checkpoint(config: LlamaConfig, ckpt: &Checkpoint) -> Result<Self> {
        let (hidden, ffn, vocab) = (config.hidden_size, config.intermediate_size, config.vocab_size);
        let (q_dim, kv_dim) = (config.q_dim(), config.kv_dim());
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let name = |suffix: &str| format!("model.layers.{i}.{suffix}.weight");
                Ok(Layer {
                    input_layernorm: ckpt.tensor_f32(&name("input_layernorm"), &[hidden])?,
                    q_proj: ckpt.matrix(&name("self_attn.q_proj"), q_dim, hidden)?,
                    k_proj: ckpt.matrix(&name("self_attn.k_proj"), kv_dim, hidden)?,
                    v_proj: ckpt.matrix(&name("self_attn.v_proj"), kv_dim, hidden)?,
                    o_proj: ckpt.matrix(&name("self_attn.o_proj"), hidden, q_dim)?,
                    post_attention_layernorm: ckpt.tensor_f32(&name("post_attention_layernorm"), &[hidden])?,
                    gate_proj: ckpt.matrix(&name("mlp.gate_proj"), ffn, hidden)?,
                    up_proj: ckpt.matrix(&name("mlp.up_proj"), ffn, hidden)?,
                    down_proj: ckpt.matrix(&name("mlp.down_proj"), hidden, ffn)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if config.tie_word_embeddings && !ckpt.contains("lm_head.weight") {
            None
        } else {
            Some(ckpt.matrix("lm_head.weight", vocab, hidden)?)
        };
        Ok(Model {
            embed_tokens: ckpt.matrix("model.embed_tokens.weight", vocab, hidden)?,
            layers,
            norm: ckpt.tensor_f32("model.norm.weight", &[hidden])?,
            lm_head,
            inv_freq: inverse_frequencies(&config.rope, config.head_dim),
            config,
        })
    }

    /// Step 1: look up each token's row of the embedding table.
    pub fn embed(&self, ids: &[u32]) -> Result<Matrix> {
        let mut x = Matrix::zeros(ids.len(), self.config.hidden_size);
        for (row, &id) in ids.iter().enumerate() {
            ensure!((id as usize) < self.config.vocab_size, "token id {id} is outside the vocabulary");
            x.row_mut(row).copy_from_slice(self.embed_tokens.row(id as usize));
        }
        Ok(x)
    }

    /// Runs `ids`, which continue the sequence held in `cache`, through every layer and
    /// the final norm. Returns their final hidden states and appends them to the cache.
    pub fn forward(&self, ids: &[u32], cache: &mut KvCache) -> Result<Matrix> {
        ensure!(!ids.is_empty(), "forward needs at least one token");
        let positions: Vec<usize> = (cache.len..cache.len + ids.len()).collect();
        let mut x = self.embed(ids)?;
        for (layer, layer_cache) in self.layers.iter().zip(&mut cache.layers) {
            x = layer.forward(&self.config, &self.inv_freq, &x, &positions, layer_cache);
        }
        cache.len += ids.len();
        Ok(rms_norm(&x, &self.norm, self.config.rms_norm_eps))
    }

    /// The LM head: one logit per vocabulary entry for each row of final hidden states.
    pub fn logits(&self, hidden: &Matrix) -> Matrix {
        linear(hidden, self.lm_head.as_ref().unwrap_or(&self.embed_tokens))
    }

    /// Logits of the last position of a whole prompt.
    pub fn last_logits(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let hidden = self.forward(ids, &mut KvCache::new(&self.config))?;
        Ok(self.logits(&hidden.rows_slice(hidden.rows - 1, hidden.rows)).data)
    }

    /// The logits that chose each token of `generated` after `prompt`: step `i` sees the
    /// prompt and `generated[..i]`, whatever the reference itself would have picked, so that
    /// an engine's logits can be compared step by step even after its tokens differ.
    pub fn step_logits(&self, prompt: &[u32], generated: &[u32]) -> Result<Vec<Vec<f32>>> {
        let mut cache = KvCache::new(&self.config);
        let mut steps = Vec::with_capacity(generated.len());
        let mut next_input = prompt;
        for index in 0..generated.len() {
            let hidden = self.forward(next_input, &mut cache)?;
            steps.push(self.logits(&hidden.rows_slice(hidden.rows - 1, hidden.rows)).data);
            next_input = &generated[index..=index];
        }
        Ok(steps)
    }

    /// Greedy decoding: up to `max_new_tokens`, stopping after any of `stop_ids`.
    /// The stop token, when reached, is included in the result.
    pub fn greedy(&self, prompt: &[u32], max_new_tokens: usize, stop_ids: &[u32]) -> Result<Vec<u32>> {
        let mut cache = KvCache::new(&self.config);
        let mut generated = Vec::new();
        let mut next_input = prompt.to_vec();
        while generated.len() < max_new_tokens {
            let hidden = self.forward(&next_input, &mut cache)?;
            let logits = self.logits(&hidden.rows_slice(hidden.rows - 1, hidden.rows));
            let token = argmax(&logits.data);
            generated.push(token);
            if stop_ids.contains(&token) {
                break;
            }
            next_input = vec![token];
        }
        Ok(generated)
    }
}

impl Layer {
    /// One decoder layer: the attention sublayer, then the MLP sublayer.
    pub fn forward(
        &self,
        config: &LlamaConfig,
        inv_freq: &[f64],
        x: &Matrix,
        positions: &[usize],
        cache: &mut LayerCache,
    ) -> Matrix {
        let x = self.attention_block(config, inv_freq, x, positions, cache);
        self.mlp_block(config, &x)
    }

    /// `x + o_proj(attention(input_layernorm(x)))`.
    pub fn attention_block(
        &self,
        config: &LlamaConfig,
        inv_freq: &[f64],
        x: &Matrix,
        positions: &[usize],
        cache: &mut LayerCache,
    ) -> Matrix {
        let normed = rms_norm(x, &self.input_layernorm, config.rms_norm_eps);
        let (q, k, v) = self.project_qkv(config, inv_freq, &normed, positions);
        cache.keys.extend_from_slice(&k.data);
        cache.values.extend_from_slice(&v.data);
        let attended = causal_attention(config, &q, positions, cache);
        x.add(&linear(&attended, &self.o_proj))
    }

    /// The query, key and value projections of normalized rows, with RoPE applied to q and k.
    pub fn project_qkv(
        &self,
        config: &LlamaConfig,
        inv_freq: &[f64],
        normed: &Matrix,
        positions: &[usize],
    ) -> (Matrix, Matrix, Matrix) {
        let mut q = linear(normed, &self.q_proj);
        let mut k = linear(normed, &self.k_proj);
        let v = linear(normed, &self.v_proj);
        apply_rope(&mut q, positions, inv_freq, config.head_dim);
        apply_rope(&mut k, positions, inv_freq, config.head_dim);
        (q, k, v)
    }

    /// `x + down_proj(silu(gate_proj(h)) * up_proj(h))` with `h = post_attention_layernorm(x)`.
    pub fn mlp_block(&self, config: &LlamaConfig, x: &Matrix) -> Matrix {
        let h = rms_norm(x, &self.post_attention_layernorm, config.rms_norm_eps);
        x.add(&linear(&self.swiglu(&h), &self.down_proj))
    }

    /// The MLP's hidden activation: `silu(gate_proj(h)) * up_proj(h)`.
    pub fn swiglu(&self, h: &Matrix) -> Matrix {
        let gate = linear(h, &self.gate_proj);
        let up = linear(h, &self.up_proj);
        let data = gate.data.iter().zip(&up.data).map(|(&g, &u)| silu(g) * u).collect();
        Matrix::from_vec(gate.rows, gate.cols, data)
    }
}

/// RMSNorm: each row divided by its root mean square, then scaled by `weight`.
pub fn rms_norm(x: &Matrix, weight: &[f32], eps: f32) -> Matrix {
    assert_eq!(x.cols, weight.len());
    let mut out = x.clone();
    for r in 0..x.rows {
        let row = out.row_mut(r);
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
        let scale = 1.0 / (mean_square + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = *v * scale * w;
        }
    }
    out
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Causal grouped-query attention. `q` holds the rows at `positions` (the newest ones);
/// `cache` holds keys and values for positions `0..=positions.last()`. Each query head
/// `h` reads key/value head `h / group_size`; it sees only positions at or before its own.
pub fn causal_attention(config: &LlamaConfig, q: &Matrix, positions: &[usize], cache: &LayerCache) -> Matrix {
    let (head_dim, kv_dim) = (config.head_dim, config.kv_dim());
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut out = Matrix::zeros(q.rows, config.q_dim());
    out.data.par_chunks_mut(config.q_dim()).enumerate().for_each(|(row, out_row)| {
        let visible = positions[row] + 1;
        for head in 0..config.num_attention_heads {
            let kv_head = head / config.group_size();
            let query = &q.row(row)[head * head_dim..(head + 1) * head_dim];
            let key = |pos: usize| &cache.keys[pos * kv_dim + kv_head * head_dim..][..head_dim];
            let value = |pos: usize| &cache.values[pos * kv_dim + kv_head * head_dim..][..head_dim];
            let scores: Vec<f32> = (0..visible).map(|pos| dot(query, key(pos)) * scale).collect();
            let weights = softmax(&scores);
            let out_head = &mut out_row[head * head_dim..(head + 1) * head_dim];
            for (pos, weight) in weights.iter().enumerate() {
                for (o, v) in out_head.iter_mut().zip(value(pos)) {
                    *o += weight * v;
                }
            }
        }
    });
    out
}

/// Softmax with the maximum subtracted first, so `exp` never overflows.
pub fn softmax(scores: &[f32]) -> Vec<f32> {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

/// Index of the largest value; the first one wins a tie (as `torch.argmax` does).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}
