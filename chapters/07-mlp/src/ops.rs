//! The operations of the forward pass, one function per kernel launch. Each takes its
//! inputs on the GPU and returns a new GPU buffer; nothing here waits for the GPU.

use anyhow::{Result, ensure};
use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType_t};
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
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

// ANCHOR: rms_norm
/// RMSNorm of each of `rows` rows: `[rows, hidden] → [rows, hidden]`.
pub fn rms_norm(gpu: &Gpu, x: &CudaSlice<bf16>, weight: &CudaSlice<bf16>, config: &Config) -> Result<CudaSlice<bf16>> {
    let rows = x.len() / config.hidden_size;
    let mut out = gpu.alloc_nan::<bf16>(x.len())?;
    let (hidden, eps) = (config.hidden_size as i32, config.rms_norm_eps);
    // One block of 256 threads (8 warps) per row: each thread handles 8 of 2,048 values.
    let launch = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match the kernel's signature; x and out hold rows · hidden values.
    unsafe {
        gpu.stream
            .launch_builder(&gpu.kernels.rms_norm)
            .arg(x)
            .arg(weight)
            .arg(&mut out)
            .arg(&hidden)
            .arg(&eps)
            .launch(launch)
    }?;
    Ok(out)
}
// ANCHOR_END: rms_norm

// ANCHOR: linear
/// A linear layer: `y = x · wᵀ`, with x `[rows, in]`, w `[out, in]` (PyTorch's layout, as
/// stored in the file) and y `[rows, out]`, all row-major; bf16 in and out, fp32 sums.
///
/// cuBLAS follows Fortran and reads every matrix column-major. Read column-major, our
/// row-major x is xᵀ `[in, rows]`, w is wᵀ `[in, out]`, and a column-major `[out, rows]`
/// result is exactly our row-major y. So we ask cuBLAS for `yᵀ = w · xᵀ`: its A is w,
/// transposed back (`OP_T`), its B is x as it stands (`OP_N`). No data moves.
pub fn linear(gpu: &Gpu, x: &CudaSlice<bf16>, w: &CudaSlice<bf16>, in_features: usize) -> Result<CudaSlice<bf16>> {
    ensure!(x.len().is_multiple_of(in_features) && w.len().is_multiple_of(in_features), "linear: widths do not match");
    let rows = x.len() / in_features;
    let out_features = w.len() / in_features;
    let mut y = gpu.alloc_nan::<bf16>(rows * out_features)?;
    let gemm = GemmConfig {
        transa: CUBLAS_OP_T,
        transb: CUBLAS_OP_N,
        m: out_features as i32,
        n: rows as i32,
        k: in_features as i32,
        alpha: bf16::ONE,
        lda: in_features as i32,
        ldb: in_features as i32,
        beta: bf16::ZERO, // C is only written, never read
        ldc: out_features as i32,
    };
    // SAFETY: the sizes above describe exactly the three buffers.
    unsafe { gpu.blas.gemm(gemm, w, x, &mut y) }?;
    Ok(y)
}
// ANCHOR_END: linear

// ANCHOR: linear_add
/// `residual += x · wᵀ`: a linear layer whose result is added to the residual stream.
/// cuBLAS computes `C = α·A·B + β·C`; with β = 1 and C the residual stream, the addition
/// happens inside the matrix product, in fp32, with one rounding to bf16 at the end.
pub fn linear_add(
    gpu: &Gpu,
    x: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    in_features: usize,
    residual: &mut CudaSlice<bf16>,
) -> Result<()> {
    let rows = x.len() / in_features;
    let out_features = w.len() / in_features;
    ensure!(residual.len() == rows * out_features, "residual stream has the wrong size");
    let gemm = GemmConfig {
        transa: CUBLAS_OP_T,
        transb: CUBLAS_OP_N,
        m: out_features as i32,
        n: rows as i32,
        k: in_features as i32,
        alpha: bf16::ONE,
        lda: in_features as i32,
        ldb: in_features as i32,
        beta: bf16::ONE, // C is read: the residual stream
        ldc: out_features as i32,
    };
    // SAFETY: the sizes above describe exactly the three buffers.
    unsafe { gpu.blas.gemm(gemm, w, x, residual) }?;
    Ok(())
}
// ANCHOR_END: linear_add

// ANCHOR: rope
/// Rotates every head of every row in place; row `r` holds the token at `positions[r]`.
pub fn rope(
    gpu: &Gpu,
    x: &mut CudaSlice<bf16>,
    positions: &CudaSlice<u32>,
    inv_freq: &CudaSlice<f32>,
    heads: usize,
    config: &Config,
) -> Result<()> {
    ensure!(x.len() == positions.len() * heads * config.head_dim, "rope: x does not hold one row per position");
    let (heads, head_dim) = (heads as i32, config.head_dim as i32);
    let launch = LaunchConfig { grid_dim: (positions.len() as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match the kernel's signature; x holds positions.len() rows of
    // heads · head_dim values, and inv_freq holds head_dim / 2 values.
    unsafe {
        gpu.stream
            .launch_builder(&gpu.kernels.rope)
            .arg(x)
            .arg(positions)
            .arg(inv_freq)
            .arg(&heads)
            .arg(&head_dim)
            .launch(launch)
    }?;
    Ok(())
}
// ANCHOR_END: rope

// ANCHOR: attention
/// The most keys [`attention_prefill`] can score: one fp32 score per key sits in shared
/// memory, beside the kernel's own 1 KiB query buffer (MAX_HEAD_DIM floats), and a block
/// may use 48 KiB.
pub const ATTENTION_MAX_KEYS: usize = (48 * 1024 - 256 * std::mem::size_of::<f32>()) / std::mem::size_of::<f32>();

/// Causal grouped-query attention over a whole prompt: q `[tokens, q_heads · head_dim]`,
/// k and v `[tokens, kv_heads · head_dim]` → `[tokens, q_heads · head_dim]`.
pub fn attention_prefill(
    gpu: &Gpu,
    q: &CudaSlice<bf16>,
    k: &CudaSlice<bf16>,
    v: &CudaSlice<bf16>,
    config: &Config,
) -> Result<CudaSlice<bf16>> {
    let tokens = q.len() / (config.num_attention_heads * config.head_dim);
    ensure!(config.head_dim <= 256, "the attention kernel handles head_dim up to 256");
    ensure!(tokens <= ATTENTION_MAX_KEYS, "{tokens} tokens is too many for one attention block's shared memory");
    let scores_bytes = tokens * std::mem::size_of::<f32>();
    let mut out = gpu.alloc_nan::<bf16>(q.len())?;
    let (q_heads, kv_heads, head_dim) =
        (config.num_attention_heads as i32, config.num_key_value_heads as i32, config.head_dim as i32);
    let scale = 1.0 / (config.head_dim as f32).sqrt();
    let launch = LaunchConfig {
        grid_dim: (tokens as u32, config.num_attention_heads as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: scores_bytes as u32,
    };
    // SAFETY: the arguments match the kernel's signature and the sizes checked above.
    unsafe {
        gpu.stream
            .launch_builder(&gpu.kernels.attention_prefill)
            .arg(q)
            .arg(k)
            .arg(v)
            .arg(&mut out)
            .arg(&q_heads)
            .arg(&kv_heads)
            .arg(&head_dim)
            .arg(&scale)
            .launch(launch)
    }?;
    Ok(out)
}
// ANCHOR_END: attention

// ANCHOR: swiglu
/// The MLP's activation: `silu(gate) * up`, element by element.
pub fn swiglu(gpu: &Gpu, gate: &CudaSlice<bf16>, up: &CudaSlice<bf16>) -> Result<CudaSlice<bf16>> {
    let mut out = gpu.alloc_nan::<bf16>(gate.len())?;
    let n = gate.len() as i32;
    let launch =
        LaunchConfig { grid_dim: (gate.len().div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match the kernel's signature; all three buffers hold n values.
    unsafe { gpu.stream.launch_builder(&gpu.kernels.silu_mul).arg(gate).arg(up).arg(&mut out).arg(&n).launch(launch) }?;
    Ok(out)
}
// ANCHOR_END: swiglu

// ANCHOR: lm_head
/// The LM head: one fp32 logit per vocabulary entry for each row of `x` `[rows, hidden]`,
/// `logits = x · wᵀ` with w `[vocab, hidden]` (the embedding table, when tied).
///
/// The same row-major trick as [`linear`], but the output is fp32: in bf16 the logits near
/// 20 would be rounded to steps of 0.125, enough to make the two best tokens equal, and
/// a tie goes to the lower id whichever was really larger.
/// cudarc's safe `Gemm` writes the input type, so we call `cublasGemmEx` ourselves.
pub fn lm_head(gpu: &Gpu, x: &CudaView<bf16>, w: &CudaSlice<bf16>, config: &Config) -> Result<CudaSlice<f32>> {
    let hidden = config.hidden_size;
    let (rows, vocab) = (x.len() / hidden, w.len() / hidden);
    let mut logits = gpu.alloc_nan::<f32>(rows * vocab)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    {
        let (w_ptr, _w) = w.device_ptr(&gpu.stream);
        let (x_ptr, _x) = x.device_ptr(&gpu.stream);
        let (logits_ptr, _l) = logits.device_ptr_mut(&gpu.stream);
        // SAFETY: the sizes describe exactly the three buffers; alpha and beta are f32, as
        // the fp32 compute type requires.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *gpu.blas.handle(),
                CUBLAS_OP_T,
                CUBLAS_OP_N,
                vocab as i32,
                rows as i32,
                hidden as i32,
                (&alpha as *const f32).cast(),
                w_ptr as *const _,
                cudaDataType_t::CUDA_R_16BF,
                hidden as i32,
                x_ptr as *const _,
                cudaDataType_t::CUDA_R_16BF,
                hidden as i32,
                (&beta as *const f32).cast(),
                logits_ptr as *mut _,
                cudaDataType_t::CUDA_R_32F,
                vocab as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }?;
    }
    Ok(logits)
}
// ANCHOR_END: lm_head

// ANCHOR: argmax
/// The index of the largest logit in each row of `[rows, vocab]`.
pub fn argmax(gpu: &Gpu, logits: &CudaSlice<f32>, vocab: usize) -> Result<CudaSlice<u32>> {
    let rows = logits.len() / vocab;
    let mut out = gpu.alloc_nan::<u32>(rows)?;
    let vocab = vocab as i32;
    let launch = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match the kernel's signature; logits holds rows · vocab values.
    unsafe {
        gpu.stream.launch_builder(&gpu.kernels.argmax_rows).arg(logits).arg(&vocab).arg(&mut out).launch(launch)
    }?;
    Ok(out)
}
// ANCHOR_END: argmax
