//! The model on the GPU: its weights, its shape, the activation buffers its forward pass
//! writes, and the KV cache, all allocated once for the most tokens the program runs.
//!
//! Each decoder layer is two sublayers that add to the residual stream `x`:
//!
//! ```text
//! x += o_proj(attention(rope(q), rope(k), v))   with q, k, v projected from rms_norm(x)
//! x += down_proj(silu(gate_proj(h)) * up_proj(h))   with h = rms_norm(x)
//! ```
//!
//! A pass runs either the whole prompt from position 0 (the *prefill*, chapter 7's forward
//! pass) or one new token at the next position (a *decode* step). Both write each
//! position's keys and values into the cache, and attention reads them from there.
//!
//! Chapter by chapter this grows into llama2.c's `Transformer` and `RunState` in one: each
//! chapter adds the buffers and the steps it teaches, never parameters threaded through
//! every call.

use anyhow::{Result, ensure};
use cudarc::driver::CudaSlice;
use half::bf16;

use crate::config::Config;
use crate::gpu::Gpu;
use crate::kv_cache::KvCache;
use crate::ops;
use crate::rope;
use crate::weights::Weights;

// ANCHOR: model
/// Everything the forward pass needs, owned in one place.
pub struct Model {
    pub gpu: Gpu,
    pub weights: Weights,
    pub config: Config,
    pub act: Activations,
    /// RoPE's rotation speed of each pair of a head `[head_dim / 2]` (see `rope.rs`).
    pub inv_freq: CudaSlice<f32>,
    /// Every layer's keys and values of the positions processed so far.
    pub cache: KvCache,
    /// How many tokens the activations hold now (the first `rows` rows of each buffer).
    pub rows: usize,
    /// The position of the first of them: 0 in the prefill, the new token's in a decode step.
    pub start: usize,
}

/// The forward pass's working memory, each buffer sized for `max_rows` tokens.
pub struct Activations {
    pub max_rows: usize,
    /// The token ids `[max_rows]`.
    pub ids: CudaSlice<u32>,
    /// Every position `[max_rows]`: 0, 1, 2, … A pass starting at position `start` reads
    /// its rows' positions from `positions[start..]`, so a decode step uploads none.
    pub positions: CudaSlice<u32>,
    /// The residual stream `[max_rows, hidden]`: each token's row of numbers.
    pub x: CudaSlice<bf16>,
    /// A sublayer's normalized input `[max_rows, hidden]`.
    pub normed: CudaSlice<bf16>,
    /// Queries `[max_rows, q_heads · head_dim]`. Keys and values go straight into the cache.
    pub q: CudaSlice<bf16>,
    /// Attention's output before its projection `[max_rows, q_heads · head_dim]`.
    pub attended: CudaSlice<bf16>,
    /// The MLP's two widenings `[max_rows, intermediate]`; the activation overwrites `gate`.
    pub gate: CudaSlice<bf16>,
    pub up: CudaSlice<bf16>,
    /// The last position's fp32 logits `[vocab]`, and the id chosen from them `[1]`.
    pub logits: CudaSlice<f32>,
    pub next: CudaSlice<u32>,
}
// ANCHOR_END: model

/// The two halves of a decoder layer, as a hook on the forward pass sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sublayer {
    Attention,
    Mlp,
}

/// When a hook is called: just before a sublayer runs, or just after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    Before,
    After,
}

impl Activations {
    /// Allocates every buffer once; they start as NaN (see [`Gpu::alloc_nan`]).
    fn new(gpu: &Gpu, config: &Config, max_rows: usize) -> Result<Self> {
        let q_dim = config.num_attention_heads * config.head_dim;
        let positions: Vec<u32> = (0..max_rows as u32).collect();
        Ok(Activations {
            max_rows,
            ids: gpu.alloc_nan(max_rows)?,
            positions: gpu.stream.clone_htod(&positions)?,
            x: gpu.alloc_nan(max_rows * config.hidden_size)?,
            normed: gpu.alloc_nan(max_rows * config.hidden_size)?,
            q: gpu.alloc_nan(max_rows * q_dim)?,
            attended: gpu.alloc_nan(max_rows * q_dim)?,
            gate: gpu.alloc_nan(max_rows * config.intermediate_size)?,
            up: gpu.alloc_nan(max_rows * config.intermediate_size)?,
            logits: gpu.alloc_nan(config.vocab_size)?,
            next: gpu.alloc_nan(1)?,
        })
    }
}

impl Model {
    /// A model whose buffers and cache hold `max_rows` positions: the context.
    pub fn new(gpu: Gpu, weights: Weights, config: Config, max_rows: usize) -> Result<Self> {
        let act = Activations::new(&gpu, &config, max_rows)?;
        let inv_freq = gpu.stream.clone_htod(&rope::inverse_frequencies(&config))?;
        let cache = KvCache::new(&gpu, &config, max_rows)?;
        Ok(Model { gpu, weights, config, act, inv_freq, cache, rows: 0, start: 0 })
    }

    // ANCHOR: embed_tokens
    /// Copies the token ids to the GPU and gathers their embedding rows into `x`.
    pub fn embed(&mut self, ids: &[u32]) -> Result<()> {
        let Model { gpu, weights, config, act, rows, .. } = self;
        ensure!(ids.len() <= act.max_rows, "{} tokens, but the buffers hold {}", ids.len(), act.max_rows);
        // The kernel trusts its ids; an id past the table would read someone else's memory.
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= config.vocab_size) {
            anyhow::bail!("token id {bad} is outside the vocabulary of {} tokens", config.vocab_size);
        }
        *rows = ids.len();
        let hidden = config.hidden_size;
        gpu.stream.memcpy_htod(ids, &mut act.ids.slice_mut(..ids.len()))?;
        ops::embedding(
            gpu,
            &weights.embed_tokens,
            &act.ids.slice(..ids.len()),
            &mut act.x.slice_mut(..ids.len() * hidden),
            hidden,
        )
    }
    // ANCHOR_END: embed_tokens

    // ANCHOR: input_norm
    /// Layer `layer`'s `input_layernorm` of the stream: `normed = rms_norm(x)`, what the
    /// attention sublayer's projections read.
    pub fn input_norm(&mut self, layer: usize) -> Result<()> {
        let Model { gpu, weights, config, act, rows, .. } = self;
        let n = *rows * config.hidden_size;
        let weight = &weights.layers[layer].input_layernorm;
        let (x, mut normed) = (act.x.slice(..n), act.normed.slice_mut(..n));
        ops::rms_norm(gpu, &x, weight, &mut normed, config.hidden_size, config.rms_norm_eps)
    }
    // ANCHOR_END: input_norm

    // ANCHOR: project_qkv
    /// Layer `layer`'s query, key and value projections of `normed`: three matrix products.
    /// Keys and values are written straight into the cache, at the pass's positions.
    pub fn project_qkv(&mut self, layer: usize) -> Result<()> {
        let Model { gpu, weights, config, act, cache, rows, start, .. } = self;
        let weights = &weights.layers[layer];
        let hidden = config.hidden_size;
        let q_dim = config.num_attention_heads * config.head_dim;
        let normed = act.normed.slice(..*rows * hidden);
        ops::linear(gpu, &normed, &weights.q_proj, &mut act.q.slice_mut(..*rows * q_dim), hidden)?;
        let (mut k, mut v) = cache.rows_mut(layer, *start..*start + *rows)?;
        ops::linear(gpu, &normed, &weights.k_proj, &mut k, hidden)?;
        ops::linear(gpu, &normed, &weights.v_proj, &mut v, hidden)
    }

    /// RoPE on the queries and on the new keys in the cache, in place: each row turned by
    /// its absolute position.
    pub fn rotate_qk(&mut self, layer: usize) -> Result<()> {
        let Model { gpu, config, act, cache, inv_freq, rows, start, .. } = self;
        let (q_heads, kv_heads, head_dim) = (config.num_attention_heads, config.num_key_value_heads, config.head_dim);
        let positions = act.positions.slice(*start..*start + *rows);
        let mut q = act.q.slice_mut(..*rows * q_heads * head_dim);
        ops::rope(gpu, &mut q, &positions, inv_freq, q_heads, head_dim)?;
        let (mut k, _) = cache.rows_mut(layer, *start..*start + *rows)?;
        ops::rope(gpu, &mut k, &positions, inv_freq, kv_heads, head_dim)
    }
    // ANCHOR_END: project_qkv

    // ANCHOR: attention_sublayer
    /// Layer `layer`'s attention sublayer: `x += o_proj(attention(x))`. Every step's
    /// result stays in its buffer (`normed`, `q`, `attended`, the cache) until the next
    /// sublayer writes it.
    pub fn attention_sublayer(&mut self, layer: usize) -> Result<()> {
        self.attention(layer)?;
        let Model { gpu, weights, config, act, rows, .. } = self;
        let q_dim = config.num_attention_heads * config.head_dim;
        let attended = act.attended.slice(..*rows * q_dim);
        let mut x = act.x.slice_mut(..*rows * config.hidden_size);
        ops::linear_add(gpu, &attended, &weights.layers[layer].o_proj, &mut x, q_dim)
    }

    /// Attention before its output projection: `attended = attention(rope(q), rope(k), v)`
    /// with q, k, v projected from `rms_norm(x)`, over every cached position up to the
    /// pass's last: chapter 6's kernel for the prefill, the decode kernel for one new token.
    pub fn attention(&mut self, layer: usize) -> Result<()> {
        self.input_norm(layer)?;
        self.project_qkv(layer)?;
        self.rotate_qk(layer)?;
        let Model { gpu, config, act, cache, rows, start, .. } = self;
        let q_dim = config.num_attention_heads * config.head_dim;
        let q = act.q.slice(..*rows * q_dim);
        let mut attended = act.attended.slice_mut(..*rows * q_dim);
        let (k, v) = cache.rows(layer, 0..*start + *rows)?;
        if *start == 0 {
            // The prefill: row i is position i and attends to positions 0..=i.
            ops::attention_prefill(gpu, &q, &k, &v, &mut attended, config)
        } else {
            ensure!(*rows == 1, "after the prefill, tokens are decoded one at a time");
            ops::attention_decode(gpu, &q, &k, &v, &mut attended, config)
        }
    }
    // ANCHOR_END: attention_sublayer

    // ANCHOR: mlp_sublayer
    /// Layer `layer`'s MLP sublayer: `x += down_proj(mlp_activation(x))`.
    pub fn mlp_sublayer(&mut self, layer: usize) -> Result<()> {
        self.mlp_activation(layer)?;
        let Model { gpu, weights, config, act, rows, .. } = self;
        let ffn = config.intermediate_size;
        let activation = act.gate.slice(..*rows * ffn);
        let mut x = act.x.slice_mut(..*rows * config.hidden_size);
        ops::linear_add(gpu, &activation, &weights.layers[layer].down_proj, &mut x, ffn)
    }

    /// The MLP before its down projection: `silu(gate_proj(h)) * up_proj(h)` with
    /// `h = rms_norm(x)`: widen to 8,192 twice and gate one with the other (into `gate`).
    pub fn mlp_activation(&mut self, layer: usize) -> Result<()> {
        self.post_attention_norm(layer)?;
        let Model { gpu, weights, config, act, rows, .. } = self;
        let layer = &weights.layers[layer];
        let (hidden, ffn) = (config.hidden_size, config.intermediate_size);
        let normed = act.normed.slice(..*rows * hidden);
        let (mut gate, mut up) = (act.gate.slice_mut(..*rows * ffn), act.up.slice_mut(..*rows * ffn));
        ops::linear(gpu, &normed, &layer.gate_proj, &mut gate, hidden)?;
        ops::linear(gpu, &normed, &layer.up_proj, &mut up, hidden)?;
        ops::swiglu(gpu, &mut gate, &up.as_view())
    }

    /// Layer `layer`'s `post_attention_layernorm` of the stream, into `normed`.
    fn post_attention_norm(&mut self, layer: usize) -> Result<()> {
        let Model { gpu, weights, config, act, rows, .. } = self;
        let n = *rows * config.hidden_size;
        let weight = &weights.layers[layer].post_attention_layernorm;
        let (x, mut normed) = (act.x.slice(..n), act.normed.slice_mut(..n));
        ops::rms_norm(gpu, &x, weight, &mut normed, config.hidden_size, config.rms_norm_eps)
    }
    // ANCHOR_END: mlp_sublayer

    // ANCHOR: forward
    /// The prefill: runs the sequence `ids` (positions 0, 1, …) through the whole model,
    /// fills the cache's first `ids.len()` positions, and leaves the fp32 logits of its last
    /// position in `act.logits`: the scores of every possible next token.
    pub fn forward(&mut self, ids: &[u32]) -> Result<()> {
        self.forward_with_hook(ids, |_, _, _, _| Ok(()))
    }

    /// [`Model::forward`], calling `hook` just before and just after every sublayer with the
    /// model as it is then. `--check` reads the buffers there, so the forward pass it checks
    /// is this one, not a copy of it.
    pub fn forward_with_hook(
        &mut self,
        ids: &[u32],
        mut hook: impl FnMut(&Model, usize, Sublayer, Moment) -> Result<()>,
    ) -> Result<()> {
        ensure!(!ids.is_empty(), "the forward pass needs at least one token");
        ensure!(ids.len() <= self.cache.capacity, "{} tokens, but the cache holds {}", ids.len(), self.cache.capacity);
        self.start = 0;
        self.embed(ids)?;
        for layer in 0..self.config.num_hidden_layers {
            for sublayer in [Sublayer::Attention, Sublayer::Mlp] {
                hook(self, layer, sublayer, Moment::Before)?;
                match sublayer {
                    Sublayer::Attention => self.attention_sublayer(layer)?,
                    Sublayer::Mlp => self.mlp_sublayer(layer)?,
                }
                hook(self, layer, sublayer, Moment::After)?;
            }
        }
        self.cache.len = ids.len();
        self.last_logits()
    }

    // ANCHOR: decode
    /// A decode step: runs one new token `id` at the next position, `cache.len`. Its key and
    /// value join the cache, and its attention reads every cached position; the logits of
    /// what follows it are left in `act.logits`. No allocation: one 4-byte copy of the id.
    pub fn decode(&mut self, id: u32) -> Result<()> {
        ensure!(self.cache.len > 0, "a decode step follows the prefill");
        ensure!(self.cache.len < self.cache.capacity, "the cache's {} positions are full", self.cache.capacity);
        self.start = self.cache.len;
        self.embed(&[id])?;
        for layer in 0..self.config.num_hidden_layers {
            self.attention_sublayer(layer)?;
            self.mlp_sublayer(layer)?;
        }
        self.cache.len += 1;
        self.last_logits()
    }
    // ANCHOR_END: decode

    /// The final norm and the LM head, for the last position only: its logits are all that
    /// choosing the next token needs.
    fn last_logits(&mut self) -> Result<()> {
        let Model { gpu, weights, config, act, rows, .. } = self;
        let hidden = config.hidden_size;
        let last_row = act.x.slice((*rows - 1) * hidden..*rows * hidden);
        ops::rms_norm(gpu, &last_row, &weights.norm, &mut act.normed.slice_mut(..hidden), hidden, config.rms_norm_eps)?;
        let lm_head = weights.lm_head.as_ref().unwrap_or(&weights.embed_tokens);
        ops::lm_head(gpu, &act.normed.slice(..hidden), lm_head, &mut act.logits.slice_mut(..), hidden)
    }
    // ANCHOR_END: forward

    // ANCHOR: next_token
    /// The most likely next token after the last forward pass: argmax on the GPU, and one
    /// 4-byte copy back, which waits for the GPU to finish.
    pub fn next_token(&mut self) -> Result<u32> {
        let Model { gpu, config, act, .. } = self;
        ops::argmax(gpu, &act.logits.slice(..), &mut act.next.slice_mut(..), config.vocab_size)?;
        let mut next = [0u32];
        gpu.stream.memcpy_dtoh(&act.next, &mut next)?;
        ensure!((next[0] as usize) < config.vocab_size, "the logits contain NaN: the forward pass went wrong");
        Ok(next[0])
    }
    // ANCHOR_END: next_token

    /// The rows in use of one of the activation buffers, copied to the host as f32.
    pub fn read(&self, buffer: &CudaSlice<bf16>) -> Result<Vec<f32>> {
        let width = buffer.len() / self.act.max_rows;
        let values = self.gpu.stream.clone_dtoh(&buffer.slice(..self.rows * width))?;
        Ok(values.iter().map(|v| v.to_f32()).collect())
    }
}

/// bf16 roundings between the attention sublayer's input and its change to the stream,
/// counted once on every path: the normed input (on the value's path, the query's and the
/// key's), q, k and v, RoPE of q and of k, the attention output, and the change itself
/// (o_proj's product). The check's limits use it.
pub const ATTENTION_ROUNDINGS: usize = 10;
/// The same for the MLP: the normed input (on the gate's path and the up path), gate and
/// up, the activation, and the change (down_proj's product).
pub const MLP_ROUNDINGS: usize = 6;
