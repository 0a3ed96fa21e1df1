//! The whole model: the embedding, 16 decoder layers, the final norm and the LM head.
//!
//! Each decoder layer is two sublayers that add to the residual stream `x`:
//!
//! ```text
//! x += o_proj(attention(rope(q), rope(k), v))   with q, k, v projected from rms_norm(x)
//! x += down_proj(silu(gate_proj(h)) * up_proj(h))   with h = rms_norm(x)
//! ```

use anyhow::Result;
use cudarc::driver::{CudaSlice, CudaView};
use half::bf16;

use crate::config::Config;
use crate::gpu::Gpu;
use crate::ops;
use crate::weights::{LayerWeights, Weights};

// ANCHOR: forward
/// Runs the sequence `ids` (positions 0, 1, …) through the whole model and returns the
/// fp32 logits of its last position `[vocab]`: the scores of every possible next token.
pub fn forward(
    gpu: &Gpu,
    weights: &Weights,
    config: &Config,
    inv_freq: &CudaSlice<f32>,
    ids: &[u32],
) -> Result<CudaSlice<f32>> {
    let positions: Vec<u32> = (0..ids.len() as u32).collect();
    let positions = gpu.stream.clone_htod(&positions)?;
    let mut x = ops::embed(gpu, weights, config, ids)?;
    for layer in &weights.layers {
        decoder_layer(gpu, layer, config, inv_freq, &positions, &mut x)?;
    }
    let hidden = ops::rms_norm(gpu, &x, &weights.norm, config)?;
    let last_row: CudaView<bf16> = hidden.slice((ids.len() - 1) * config.hidden_size..);
    let lm_head = weights.lm_head.as_ref().unwrap_or(&weights.embed_tokens);
    ops::lm_head(gpu, &last_row, lm_head, config)
}
// ANCHOR_END: forward

// ANCHOR: decoder_layer
/// One decoder layer, updating the residual stream `x` `[tokens, hidden]` in place.
pub fn decoder_layer(
    gpu: &Gpu,
    layer: &LayerWeights,
    config: &Config,
    inv_freq: &CudaSlice<f32>,
    positions: &CudaSlice<u32>,
    x: &mut CudaSlice<bf16>,
) -> Result<()> {
    attention_sublayer(gpu, layer, config, inv_freq, positions, x)?;
    mlp_sublayer(gpu, layer, config, x)
}
// ANCHOR_END: decoder_layer

// ANCHOR: sublayers
/// The attention sublayer (chapters 4–6): `x += o_proj(attention(x))`.
pub fn attention_sublayer(
    gpu: &Gpu,
    layer: &LayerWeights,
    config: &Config,
    inv_freq: &CudaSlice<f32>,
    positions: &CudaSlice<u32>,
    x: &mut CudaSlice<bf16>,
) -> Result<()> {
    let attended = attention(gpu, layer, config, inv_freq, positions, x)?;
    ops::linear_add(gpu, &attended, &layer.o_proj, config.num_attention_heads * config.head_dim, x)
}

/// Attention before its output projection: `attention(rope(q), rope(k), v)` with q, k, v
/// projected from `rms_norm(x)`.
pub fn attention(
    gpu: &Gpu,
    layer: &LayerWeights,
    config: &Config,
    inv_freq: &CudaSlice<f32>,
    positions: &CudaSlice<u32>,
    x: &CudaSlice<bf16>,
) -> Result<CudaSlice<bf16>> {
    let hidden = config.hidden_size;
    let normed = ops::rms_norm(gpu, x, &layer.input_layernorm, config)?;
    let mut q = ops::linear(gpu, &normed, &layer.q_proj, hidden)?;
    let mut k = ops::linear(gpu, &normed, &layer.k_proj, hidden)?;
    let v = ops::linear(gpu, &normed, &layer.v_proj, hidden)?;
    ops::rope(gpu, &mut q, positions, inv_freq, config.num_attention_heads, config)?;
    ops::rope(gpu, &mut k, positions, inv_freq, config.num_key_value_heads, config)?;
    ops::attention_prefill(gpu, &q, &k, &v, config)
}

/// The MLP sublayer: `x += down_proj(mlp_activation(x))`.
pub fn mlp_sublayer(gpu: &Gpu, layer: &LayerWeights, config: &Config, x: &mut CudaSlice<bf16>) -> Result<()> {
    let activation = mlp_activation(gpu, layer, config, x)?;
    ops::linear_add(gpu, &activation, &layer.down_proj, config.intermediate_size, x)
}

/// The MLP before its down projection: `silu(gate_proj(h)) * up_proj(h)` with
/// `h = rms_norm(x)`: widen to 8,192 twice and gate one with the other.
pub fn mlp_activation(
    gpu: &Gpu,
    layer: &LayerWeights,
    config: &Config,
    x: &CudaSlice<bf16>,
) -> Result<CudaSlice<bf16>> {
    let hidden = config.hidden_size;
    let normed = ops::rms_norm(gpu, x, &layer.post_attention_layernorm, config)?;
    let gate = ops::linear(gpu, &normed, &layer.gate_proj, hidden)?;
    let up = ops::linear(gpu, &normed, &layer.up_proj, hidden)?;
    ops::swiglu(gpu, &gate, &up)
}

/// bf16 roundings between the attention sublayer's input and its change to the stream,
/// counted once on every path: the normed input (on the value's path, the query's and the
/// key's), q, k and v, RoPE of q and of k, the attention output, and the change itself
/// (o_proj's product). The check's limits use it.
pub const ATTENTION_ROUNDINGS: usize = 10;
/// The same for the MLP: the normed input (on the gate's path and the up path), gate and
/// up, the activation, and the change (down_proj's product).
pub const MLP_ROUNDINGS: usize = 6;
// ANCHOR_END: sublayers
