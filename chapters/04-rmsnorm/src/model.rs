//! The model on the GPU: its weights, its shape, and the activation buffers its forward
//! pass writes, allocated once for the most tokens the program runs.
//!
//! Chapter by chapter this grows into llama2.c's `Transformer` and `RunState` in one: each
//! chapter adds the buffers and the steps it teaches, never parameters threaded through
//! every call.

use anyhow::{Result, ensure};
use cudarc::driver::CudaSlice;
use half::bf16;

use crate::config::Config;
use crate::gpu::Gpu;
use crate::ops;
use crate::weights::Weights;

// ANCHOR: model
/// Everything the forward pass needs, owned in one place.
pub struct Model {
    pub gpu: Gpu,
    pub weights: Weights,
    pub config: Config,
    pub act: Activations,
    /// How many tokens the activations hold now (the first `rows` rows of each buffer).
    pub rows: usize,
}

/// The forward pass's working memory, each buffer sized for `max_rows` tokens.
pub struct Activations {
    pub max_rows: usize,
    /// The token ids `[max_rows]`.
    pub ids: CudaSlice<u32>,
    /// The residual stream `[max_rows, hidden]`: each token's row of numbers.
    pub x: CudaSlice<bf16>,
    /// A sublayer's normalized input `[max_rows, hidden]`.
    pub normed: CudaSlice<bf16>,
}
// ANCHOR_END: model

impl Activations {
    /// Allocates every buffer once; they start as NaN (see [`Gpu::alloc_nan`]).
    fn new(gpu: &Gpu, config: &Config, max_rows: usize) -> Result<Self> {
        Ok(Activations {
            max_rows,
            ids: gpu.alloc_nan(max_rows)?,
            x: gpu.alloc_nan(max_rows * config.hidden_size)?,
            normed: gpu.alloc_nan(max_rows * config.hidden_size)?,
        })
    }
}

impl Model {
    pub fn new(gpu: Gpu, weights: Weights, config: Config, max_rows: usize) -> Result<Self> {
        let act = Activations::new(&gpu, &config, max_rows)?;
        Ok(Model { gpu, weights, config, act, rows: 0 })
    }

    // ANCHOR: embed_tokens
    /// Copies the token ids to the GPU and gathers their embedding rows into `x`.
    pub fn embed(&mut self, ids: &[u32]) -> Result<()> {
        let Model { gpu, weights, config, act, rows } = self;
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
        let Model { gpu, weights, config, act, rows } = self;
        let n = *rows * config.hidden_size;
        let weight = &weights.layers[layer].input_layernorm;
        let (x, mut normed) = (act.x.slice(..n), act.normed.slice_mut(..n));
        ops::rms_norm(gpu, &x, weight, &mut normed, config.hidden_size, config.rms_norm_eps)
    }
    // ANCHOR_END: input_norm

    /// The rows in use of one of the activation buffers, copied to the host as f32.
    pub fn read(&self, buffer: &CudaSlice<bf16>) -> Result<Vec<f32>> {
        let width = buffer.len() / self.act.max_rows;
        let values = self.gpu.stream.clone_dtoh(&buffer.slice(..self.rows * width))?;
        Ok(values.iter().map(|v| v.to_f32()).collect())
    }
}
