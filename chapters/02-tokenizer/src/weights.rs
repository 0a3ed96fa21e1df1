//! The weights on the GPU: one typed field per tensor kind, one [`LayerWeights`] per layer.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use crate::checkpoint::{Checkpoint, TensorEntry};
use crate::config::Config;

// ANCHOR: weights
/// One decoder layer's tensors, as BF16 on the GPU.
pub struct LayerWeights {
    pub input_layernorm: CudaSlice<bf16>,
    pub q_proj: CudaSlice<bf16>,
    pub k_proj: CudaSlice<bf16>,
    pub v_proj: CudaSlice<bf16>,
    pub o_proj: CudaSlice<bf16>,
    pub post_attention_layernorm: CudaSlice<bf16>,
    pub gate_proj: CudaSlice<bf16>,
    pub up_proj: CudaSlice<bf16>,
    pub down_proj: CudaSlice<bf16>,
}

/// Every tensor of the model, as BF16 on the GPU.
pub struct Weights {
    pub embed_tokens: CudaSlice<bf16>,
    pub layers: Vec<LayerWeights>,
    pub norm: CudaSlice<bf16>,
    /// `None` when the LM head is tied to `embed_tokens` (Llama 3.2 1B).
    pub lm_head: Option<CudaSlice<bf16>>,
}
// ANCHOR_END: weights

impl Weights {
    // ANCHOR: upload
    /// Copies every tensor from the memory-mapped file to a fresh GPU buffer.
    pub fn upload(stream: &Arc<CudaStream>, checkpoint: &Checkpoint, config: &Config) -> Result<Self> {
        let mut tensors = checkpoint.tensors.iter();
        let mut next = || -> Result<CudaSlice<bf16>> {
            let entry = tensors.next().context("checkpoint lists fewer tensors than expected")?;
            upload_tensor(stream, checkpoint, entry)
        };
        // `expected_tensors` lists them in exactly this order.
        let embed_tokens = next()?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for _ in 0..config.num_hidden_layers {
            layers.push(LayerWeights {
                input_layernorm: next()?,
                q_proj: next()?,
                k_proj: next()?,
                v_proj: next()?,
                o_proj: next()?,
                post_attention_layernorm: next()?,
                gate_proj: next()?,
                up_proj: next()?,
                down_proj: next()?,
            });
        }
        let norm = next()?;
        let lm_head = if config.tie_word_embeddings { None } else { Some(next()?) };
        stream.synchronize()?;
        Ok(Weights { embed_tokens, layers, norm, lm_head })
    }
    // ANCHOR_END: upload

    /// Every GPU buffer in the order of the checkpoint's tensor list.
    pub fn buffers(&self) -> Vec<&CudaSlice<bf16>> {
        let mut buffers = vec![&self.embed_tokens];
        for layer in &self.layers {
            buffers.extend([
                &layer.input_layernorm,
                &layer.q_proj,
                &layer.k_proj,
                &layer.v_proj,
                &layer.o_proj,
                &layer.post_attention_layernorm,
                &layer.gate_proj,
                &layer.up_proj,
                &layer.down_proj,
            ]);
        }
        buffers.push(&self.norm);
        buffers.extend(&self.lm_head);
        buffers
    }
}

// ANCHOR: upload_tensor
/// Allocates a BF16 buffer and copies the tensor's bytes into it, straight from the mapping.
fn upload_tensor(stream: &Arc<CudaStream>, checkpoint: &Checkpoint, entry: &TensorEntry) -> Result<CudaSlice<bf16>> {
    let bytes = checkpoint.bytes(entry);
    let elements = bytes.len() / 2;
    // SAFETY: every byte of the buffer is written by the copy below before anyone reads it.
    let mut buffer = unsafe { stream.alloc::<bf16>(elements) }
        .with_context(|| format!("cannot allocate {} bytes on the GPU for {}", bytes.len(), entry.name))?;
    // The file stores raw little-endian bf16, which is exactly the GPU's layout:
    // we copy bytes into the buffer viewed as bytes.
    // SAFETY: a bf16 buffer of `elements` values is `2 * elements` bytes.
    let mut as_bytes = unsafe { buffer.transmute_mut::<u8>(bytes.len()) }.context("byte view of a bf16 buffer")?;
    stream.memcpy_htod(bytes, &mut as_bytes)?;
    Ok(buffer)
}
// ANCHOR_END: upload_tensor

// ANCHOR: check
/// Reads three samples of every tensor (its start, middle and end) back from the GPU and
/// compares them byte for byte with the file. Returns how many bytes were compared.
pub fn check_against_file(stream: &Arc<CudaStream>, checkpoint: &Checkpoint, weights: &Weights) -> Result<usize> {
    const SAMPLE: usize = 2048; // bf16 values per sample
    let mut compared = 0;
    for (entry, buffer) in checkpoint.tensors.iter().zip(weights.buffers()) {
        let file_bytes = checkpoint.bytes(entry);
        ensure!(buffer.len() * 2 == file_bytes.len(), "{}: GPU buffer has the wrong size", entry.name);
        let len = buffer.len();
        let starts = [0, len.saturating_sub(SAMPLE) / 2, len.saturating_sub(SAMPLE)];
        for start in starts {
            let end = (start + SAMPLE).min(len);
            let on_gpu: Vec<bf16> = stream.clone_dtoh(&buffer.slice(start..end))?;
            let in_file = &file_bytes[start * 2..end * 2];
            let first_difference = on_gpu
                .iter()
                .zip(in_file.chunks_exact(2))
                .position(|(gpu, file)| gpu.to_le_bytes() != [file[0], file[1]]);
            if let Some(i) = first_difference {
                anyhow::bail!("{}: element {} differs between the GPU and the file", entry.name, start + i);
            }
            compared += in_file.len();
        }
    }
    Ok(compared)
}
// ANCHOR_END: check
