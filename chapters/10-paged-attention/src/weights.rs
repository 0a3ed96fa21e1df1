//! The weights on the GPU: one typed field per tensor kind, one [`LayerWeights`] per layer.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use crate::check::Checks;
use crate::checkpoint::{Checkpoint, LAYER_TENSORS, TensorEntry, layer_tensor_name};
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
        let mut uploaded = HashMap::new();
        for entry in &checkpoint.tensors {
            uploaded.insert(entry.name.clone(), upload_tensor(stream, checkpoint, entry)?);
        }
        // Every name below was checked to be in the file by `Checkpoint::open`.
        let mut take = |name: &str| uploaded.remove(name).with_context(|| format!("tensor {name} was not uploaded"));
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let tensors = LAYER_TENSORS.map(|suffix| take(&layer_tensor_name(i, suffix)));
            layers.push(LayerWeights::from_tensors(tensors)?);
        }
        let weights = Weights {
            embed_tokens: take("model.embed_tokens.weight")?,
            layers,
            norm: take("model.norm.weight")?,
            lm_head: if config.tie_word_embeddings { None } else { Some(take("lm_head.weight")?) },
        };
        stream.synchronize()?;
        Ok(weights)
    }
    // ANCHOR_END: upload

    /// Every GPU buffer with the name of the tensor it holds.
    pub fn named_buffers(&self) -> Vec<(String, &CudaSlice<bf16>)> {
        let mut buffers = vec![("model.embed_tokens.weight".to_string(), &self.embed_tokens)];
        for (i, layer) in self.layers.iter().enumerate() {
            let names = LAYER_TENSORS.map(|suffix| layer_tensor_name(i, suffix));
            buffers.extend(names.into_iter().zip(layer.tensors()));
        }
        buffers.push(("model.norm.weight".to_string(), &self.norm));
        buffers.extend(self.lm_head.iter().map(|head| ("lm_head.weight".to_string(), head)));
        buffers
    }
}

impl LayerWeights {
    /// The layer from its tensors, in the order of [`LAYER_TENSORS`].
    fn from_tensors(tensors: [Result<CudaSlice<bf16>>; 9]) -> Result<Self> {
        let [input_layernorm, q_proj, k_proj, v_proj, o_proj, post_attention_layernorm, gate_proj, up_proj, down_proj] =
            tensors;
        Ok(LayerWeights {
            input_layernorm: input_layernorm?,
            q_proj: q_proj?,
            k_proj: k_proj?,
            v_proj: v_proj?,
            o_proj: o_proj?,
            post_attention_layernorm: post_attention_layernorm?,
            gate_proj: gate_proj?,
            up_proj: up_proj?,
            down_proj: down_proj?,
        })
    }

    /// The layer's tensors, in the order of [`LAYER_TENSORS`].
    fn tensors(&self) -> [&CudaSlice<bf16>; 9] {
        [
            &self.input_layernorm,
            &self.q_proj,
            &self.k_proj,
            &self.v_proj,
            &self.o_proj,
            &self.post_attention_layernorm,
            &self.gate_proj,
            &self.up_proj,
            &self.down_proj,
        ]
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

/// What [`check_against_file`] compared and found.
pub struct FileCheck {
    pub tensors: usize,
    pub bytes: usize,
    /// How many values were compared, and how many of them differ, bit for bit.
    pub compared: usize,
    pub differing: usize,
    /// The first difference, named, and the largest difference in value.
    pub first_difference: Option<String>,
    pub max_abs_error: f32,
}

impl FileCheck {
    /// What was found, for the check line: the count, and where and how large when not zero.
    pub fn summary(&self) -> String {
        match &self.first_difference {
            None => format!("0 of {} values differ", self.compared),
            Some(first) => format!(
                "{} of {} values differ, by up to {}, the first at {first}",
                self.differing, self.compared, self.max_abs_error
            ),
        }
    }
}

/// `--check` for the upload: one verdict line on [`check_against_file`]'s comparison.
pub fn check_upload(stream: &Arc<CudaStream>, checkpoint: &Checkpoint, weights: &Weights) -> Result<()> {
    let checked = check_against_file(stream, checkpoint, weights)?;
    let mut checks = Checks::default();
    let what = format!(
        "{} tensors' start, middle and end ({} bytes) read back from the GPU vs the file",
        checked.tensors, checked.bytes
    );
    checks.record(&what, &checked.summary(), "0 differing values", checked.differing == 0);
    checks.finish()
}

// ANCHOR: check
/// Reads samples of every tensor (its start, middle and end; small tensors whole) back
/// from the GPU and compares them with the file, bit for bit.
pub fn check_against_file(stream: &Arc<CudaStream>, checkpoint: &Checkpoint, weights: &Weights) -> Result<FileCheck> {
    const SAMPLE: usize = 2048; // bf16 values per sample
    let mut result =
        FileCheck { tensors: 0, bytes: 0, compared: 0, differing: 0, first_difference: None, max_abs_error: 0.0 };
    for (name, buffer) in weights.named_buffers() {
        let entry = checkpoint.tensors.iter().find(|t| t.name == name).context("no such tensor")?;
        let file_bytes = checkpoint.bytes(entry);
        ensure!(buffer.len() * 2 == file_bytes.len(), "{name}: GPU buffer has the wrong size");
        for range in sample_ranges(buffer.len(), SAMPLE) {
            let on_gpu: Vec<bf16> = stream.clone_dtoh(&buffer.slice(range.clone()))?;
            let in_file =
                file_bytes[range.start * 2..range.end * 2].chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]));
            for (i, (g, f)) in on_gpu.iter().zip(in_file).enumerate() {
                if g.to_bits() != f.to_bits() {
                    result.differing += 1;
                    result.first_difference.get_or_insert_with(|| format!("{name}, element {}", range.start + i));
                }
                result.max_abs_error = result.max_abs_error.max((g.to_f32() - f.to_f32()).abs());
            }
            result.compared += range.len();
            result.bytes += range.len() * 2;
        }
        result.tensors += 1;
    }
    Ok(result)
}

/// The start, middle and end of a buffer of `len` values, or the whole of it when small.
fn sample_ranges(len: usize, sample: usize) -> Vec<Range<usize>> {
    let whole = 0..len;
    if len <= 3 * sample {
        return vec![whole];
    }
    let middle = (len - sample) / 2;
    vec![0..sample, middle..middle + sample, len - sample..len]
}
// ANCHOR_END: check
