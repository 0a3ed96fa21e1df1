//! The operations of the forward pass, one function per kernel launch.
//!
//! Every op has the same shape: `op(gpu, inputs…, out, sizes…)`. Inputs are views of GPU
//! buffers (weights are whole tensors), `out` is a view the op writes, and the op first
//! checks that the sizes agree, since a kernel trusts them. Nothing here allocates, and
//! nothing waits for the GPU.

use anyhow::{Result, ensure};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};
use half::bf16;

use crate::gpu::Gpu;

// ANCHOR: embed
/// Gathers the embedding rows of the token ids: `[tokens] → [tokens, hidden]`.
/// The ids must be within the table (the kernel trusts them; see `Model::embed`).
pub fn embedding(
    gpu: &Gpu,
    table: &CudaSlice<bf16>,
    ids: &CudaView<u32>,
    out: &mut CudaViewMut<bf16>,
    hidden: usize,
) -> Result<()> {
    ensure!(table.len().is_multiple_of(hidden), "embedding: the table is not {hidden} wide");
    ensure!(out.len() == ids.len() * hidden, "embedding: the output does not hold one row per id");
    gpu.poison(out)?;
    let launch = LaunchConfig { grid_dim: (ids.len() as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let hidden = hidden as i32;
    // SAFETY: the arguments match the kernel's signature and the sizes checked above.
    unsafe {
        gpu.stream.launch_builder(&gpu.kernels.embedding).arg(table).arg(ids).arg(out).arg(&hidden).launch(launch)
    }?;
    Ok(())
}
// ANCHOR_END: embed
