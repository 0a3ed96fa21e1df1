//! The operations of the forward pass, one function per kernel launch. Each takes its
//! inputs on the GPU and returns a new GPU buffer; nothing here waits for the GPU.

use anyhow::Result;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

use crate::config::Config;
use crate::gpu::Gpu;
use crate::weights::Weights;

// ANCHOR: embed
/// Uploads the token ids and gathers their embedding rows on the GPU:
/// `[tokens] → [tokens, hidden]`.
pub fn embed(gpu: &Gpu, weights: &Weights, config: &Config, ids: &[u32]) -> Result<CudaSlice<bf16>> {
    // The kernel trusts its ids; an id past the table would read someone else's memory.
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= config.vocab_size) {
        anyhow::bail!("token id {bad} is outside the vocabulary of {} tokens", config.vocab_size);
    }
    let ids_on_gpu = gpu.stream.clone_htod(ids)?;
    let mut out = gpu.alloc_nan::<bf16>(ids.len() * config.hidden_size)?;
    let hidden = config.hidden_size as i32;
    let launch = LaunchConfig { grid_dim: (ids.len() as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match the kernel's signature, and every id was checked above.
    unsafe {
        gpu.stream
            .launch_builder(&gpu.kernels.embedding_gather)
            .arg(&weights.embed_tokens)
            .arg(&ids_on_gpu)
            .arg(&mut out)
            .arg(&hidden)
            .launch(launch)
    }?;
    Ok(out)
}
// ANCHOR_END: embed
