//! The operations of the forward pass, one function per kernel launch.
//!
//! Every op has the same shape: `op(gpu, inputs…, out, sizes…)`. Inputs are views of GPU
//! buffers (weights are whole tensors), `out` is a view the op writes, and the op first
//! checks that the sizes agree, since a kernel trusts them. Nothing here allocates, and
//! nothing waits for the GPU.

use anyhow::{Result, ensure};
use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType_t};
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use half::bf16;

use crate::config::Config;
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

// ANCHOR: rms_norm
/// RMSNorm of every row: `[rows, hidden] → [rows, hidden]`.
pub fn rms_norm(
    gpu: &Gpu,
    x: &CudaView<bf16>,
    weight: &CudaSlice<bf16>,
    out: &mut CudaViewMut<bf16>,
    hidden: usize,
    eps: f32,
) -> Result<()> {
    ensure!(weight.len() == hidden && x.len().is_multiple_of(hidden), "rms_norm: rows are not {hidden} wide");
    ensure!(out.len() == x.len(), "rms_norm: the output is not the input's size");
    gpu.poison(out)?;
    let rows = x.len() / hidden;
    // One block of 256 threads (8 warps) per row: each thread handles 8 of 2,048 values.
    let launch = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let hidden = hidden as i32;
    // SAFETY: the arguments match the kernel's signature and the sizes checked above.
    unsafe {
        gpu.stream
            .launch_builder(&gpu.kernels.rms_norm)
            .arg(x)
            .arg(weight)
            .arg(out)
            .arg(&hidden)
            .arg(&eps)
            .launch(launch)
    }?;
    Ok(())
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
pub fn linear(
    gpu: &Gpu,
    x: &CudaView<bf16>,
    w: &CudaSlice<bf16>,
    y: &mut CudaViewMut<bf16>,
    in_features: usize,
) -> Result<()> {
    ensure!(x.len().is_multiple_of(in_features) && w.len().is_multiple_of(in_features), "linear: widths do not match");
    let (rows, out_features) = (x.len() / in_features, w.len() / in_features);
    ensure!(y.len() == rows * out_features, "linear: the output is not [{rows}, {out_features}]");
    gpu.poison(y)?;
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
    // SAFETY: the sizes checked above describe exactly the three buffers.
    unsafe { gpu.blas.gemm(gemm, w, x, y) }?;
    Ok(())
}
// ANCHOR_END: linear

// ANCHOR: rope
/// Rotates every head of every row in place; row `r` holds the token at `positions[r]`.
pub fn rope(
    gpu: &Gpu,
    x: &mut CudaViewMut<bf16>,
    positions: &CudaView<u32>,
    inv_freq: &CudaSlice<f32>,
    heads: usize,
    head_dim: usize,
) -> Result<()> {
    ensure!(x.len() == positions.len() * heads * head_dim, "rope: x does not hold one row per position");
    ensure!(inv_freq.len() == head_dim / 2, "rope: one frequency per pair of a head");
    let launch = LaunchConfig { grid_dim: (positions.len() as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (heads, head_dim) = (heads as i32, head_dim as i32);
    // SAFETY: the arguments match the kernel's signature and the sizes checked above.
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

// ANCHOR: linear_add
/// `residual += x · wᵀ`: a linear layer whose result is added to the residual stream.
/// cuBLAS computes `C = α·A·B + β·C`; with β = 1 and C the residual stream, the addition
/// happens inside the matrix product, in fp32, with one rounding to bf16 at the end.
pub fn linear_add(
    gpu: &Gpu,
    x: &CudaView<bf16>,
    w: &CudaSlice<bf16>,
    residual: &mut CudaViewMut<bf16>,
    in_features: usize,
) -> Result<()> {
    ensure!(
        x.len().is_multiple_of(in_features) && w.len().is_multiple_of(in_features),
        "linear_add: widths do not match"
    );
    let (rows, out_features) = (x.len() / in_features, w.len() / in_features);
    ensure!(residual.len() == rows * out_features, "linear_add: the residual stream is not [{rows}, {out_features}]");
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
    // SAFETY: the sizes checked above describe exactly the three buffers.
    unsafe { gpu.blas.gemm(gemm, w, x, residual) }?;
    Ok(())
}
// ANCHOR_END: linear_add

// ANCHOR: attention
/// The largest head [`attention_prefill`] holds: the kernel keeps the query in a fixed
/// shared array (`MAX_HEAD_DIM` in attention_prefill.cu). Llama 3's heads are 64 or 128.
pub const ATTENTION_MAX_HEAD_DIM: usize = 256;

/// The most keys [`attention_prefill`] can score: one fp32 score per key sits in shared
/// memory, beside the kernel's own 1 KiB query buffer (MAX_HEAD_DIM floats) and the two
/// block reductions' 128 bytes each, and a block may use 48 KiB.
/// (11,968 keys: a multiple of 4, so the rounding below stays within the 48 KiB.)
pub const ATTENTION_MAX_KEYS: usize =
    (48 * 1024 - (ATTENTION_MAX_HEAD_DIM + 2 * 32) * std::mem::size_of::<f32>()) / std::mem::size_of::<f32>();

/// Refuses, before anything is loaded, a model whose heads the attention kernel cannot hold.
pub fn check_attention_shape(config: &Config) -> Result<()> {
    ensure!(
        config.head_dim <= ATTENTION_MAX_HEAD_DIM,
        "head_dim {} is more than the attention kernel holds ({ATTENTION_MAX_HEAD_DIM})",
        config.head_dim
    );
    Ok(())
}

/// The scores' shared memory is rounded up to whole groups of 4 floats: the compiler reads
/// the last few scores with one wider load, which may reach past the last one (memcheck
/// reported such 12-byte reads on the H200).
const SCORE_GROUP: usize = 4 * std::mem::size_of::<f32>();

/// Causal grouped-query attention over a whole prompt: q `[tokens, q_heads · head_dim]`,
/// k and v `[tokens, kv_heads · head_dim]` → out `[tokens, q_heads · head_dim]`.
pub fn attention_prefill(
    gpu: &Gpu,
    q: &CudaView<bf16>,
    k: &CudaView<bf16>,
    v: &CudaView<bf16>,
    out: &mut CudaViewMut<bf16>,
    config: &Config,
) -> Result<()> {
    let (q_heads, kv_heads, head_dim) = (config.num_attention_heads, config.num_key_value_heads, config.head_dim);
    let tokens = q.len() / (q_heads * head_dim);
    ensure!(q.len() == tokens * q_heads * head_dim, "attention: q is not [tokens, {q_heads} x {head_dim}]");
    ensure!(
        k.len() == tokens * kv_heads * head_dim && v.len() == k.len(),
        "attention: k or v is not [{tokens}, {kv_heads} x {head_dim}]"
    );
    ensure!(out.len() == q.len(), "attention: the output is not q's size");
    ensure!(head_dim <= ATTENTION_MAX_HEAD_DIM, "the attention kernel handles head_dim up to {ATTENTION_MAX_HEAD_DIM}");
    ensure!(tokens <= ATTENTION_MAX_KEYS, "{tokens} tokens is too many for one attention block's shared memory");
    gpu.poison(out)?;
    let launch = LaunchConfig {
        grid_dim: (tokens as u32, q_heads as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: (tokens * std::mem::size_of::<f32>()).next_multiple_of(SCORE_GROUP) as u32,
    };
    let scale = 1.0 / (head_dim as f32).sqrt();
    let (q_heads, kv_heads, head_dim) = (q_heads as i32, kv_heads as i32, head_dim as i32);
    // SAFETY: the arguments match the kernel's signature and the sizes checked above.
    unsafe {
        gpu.stream
            .launch_builder(&gpu.kernels.attention_prefill)
            .arg(q)
            .arg(k)
            .arg(v)
            .arg(out)
            .arg(&q_heads)
            .arg(&kv_heads)
            .arg(&head_dim)
            .arg(&scale)
            .launch(launch)
    }?;
    Ok(())
}
// ANCHOR_END: attention

// ANCHOR: attention_decode
/// Query heads per key/value head the decode kernel holds in registers (`MAX_GROUP` in
/// attention_decode_paged.cu). Llama 3's groups are 3 and 4.
pub const DECODE_MAX_GROUP: usize = 8;
/// Threads per decode-attention block: 8 warps (`THREADS` in attention_decode_paged.cu,
/// which budgets its registers for that many).
const DECODE_THREADS: usize = 256;
/// A block may use 48 KiB of shared memory without asking for more.
const SHARED_MEMORY_LIMIT: usize = 48 * 1024;

/// The decode kernel's shared memory for this shape: every warp's softmax state (its
/// maximum, its sum and its weighted values) for each query head of the group, to merge.
fn decode_shared_bytes(config: &Config) -> usize {
    let group = config.num_attention_heads / config.num_key_value_heads;
    DECODE_THREADS / 32 * group * (config.head_dim + 2) * std::mem::size_of::<f32>()
}

/// Refuses, before anything is loaded, a shape the decode kernel cannot run: rows are read
/// 8 values per lane by a power-of-two number of lanes up to a warp, the group's queries
/// live in registers, and the merge must fit in shared memory.
pub fn check_decode_shape(config: &Config) -> Result<()> {
    let (head_dim, group) = (config.head_dim, config.num_attention_heads / config.num_key_value_heads);
    ensure!(
        head_dim.is_multiple_of(8) && (head_dim / 8).is_power_of_two() && head_dim <= 256,
        "head_dim {head_dim}: the decode attention kernel needs 8, 16, 32, 64, 128 or 256"
    );
    ensure!(group <= DECODE_MAX_GROUP, "{group} query heads per KV head: the decode kernel holds {DECODE_MAX_GROUP}");
    let shared = decode_shared_bytes(config);
    ensure!(shared <= SHARED_MEMORY_LIMIT, "decode attention would need {shared} bytes of shared memory");
    Ok(())
}

// ANCHOR_END: attention_decode

// ANCHOR: split_kv
/// The most splits of one sequence's positions (flash-decoding): [`Split::choose`] stays
/// at or below it, and the buffer of partial states is sized for it.
pub const MAX_SPLITS: usize = 16;
/// The fewest pages a split takes: 128 positions, two rounds of the kernel's 32 lane groups
/// of two rows each, so that a split has enough keys to hide its loads behind.
const MIN_PAGES_PER_SPLIT: usize = 8;

/// How a decode step's attention divides each sequence's positions among blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub splits: usize,
    pub pages_per_split: usize,
}

impl Split {
    /// One block per (key/value head, sequence), as chapter 9: one split holding every page
    /// of sequences of at most `longest_pages` pages.
    pub fn whole(longest_pages: usize) -> Split {
        Split { splits: 1, pages_per_split: longest_pages.max(1) }
    }

    /// Enough splits that the blocks fill the GPU twice over, when the batch alone does
    /// not: `rows` sequences of at most `longest_pages` pages, each split at least
    /// [`MIN_PAGES_PER_SPLIT`] pages, at most [`MAX_SPLITS`].
    pub fn choose(rows: usize, longest_pages: usize, kv_heads: usize, multiprocessors: usize) -> Split {
        let blocks = rows * kv_heads;
        let wanted = (2 * multiprocessors).div_ceil(blocks);
        let most = (longest_pages / MIN_PAGES_PER_SPLIT).clamp(1, MAX_SPLITS);
        let splits = wanted.clamp(1, most);
        if splits == 1 {
            return Split::whole(longest_pages);
        }
        let pages_per_split = longest_pages.div_ceil(splits);
        Split { splits: longest_pages.div_ceil(pages_per_split), pages_per_split }
    }
}
// ANCHOR_END: split_kv

// ANCHOR: attention_decode_paged
/// The pool and block tables as one decode step's attention reads them.
pub struct PagedKv<'a> {
    /// One layer of the pool `[pages · page_size, kv_heads · head_dim]`, keys and values.
    pub k: CudaView<'a, bf16>,
    pub v: CudaView<'a, bf16>,
    /// `[batch, table_width]`: each row's pages in order, and the positions it attends to.
    pub block_tables: CudaView<'a, u32>,
    pub lengths: CudaView<'a, u32>,
    pub table_width: usize,
    pub page_size: usize,
}

/// Attention of a batch of new tokens, each over its own sequence's positions in the page
/// pool: q `[batch, q_heads · head_dim]` → out `[batch, q_heads · head_dim]`; row b reads
/// positions `0..lengths[b]` through its block table. With more than one split each block
/// writes its softmax state to `partials` (`[batch, q_heads, MAX_SPLITS, head_dim + 2]` at
/// least) and a second kernel merges them. The kernel trusts the block tables and lengths:
/// the scheduler gives a sequence only pages of the pool, and lengths within its pages.
pub fn attention_decode_paged(
    gpu: &Gpu,
    q: &CudaView<bf16>,
    kv: &PagedKv,
    out: &mut CudaViewMut<bf16>,
    partials: &mut CudaSlice<f32>,
    split: Split,
    config: &Config,
) -> Result<()> {
    let (q_heads, kv_heads, head_dim) = (config.num_attention_heads, config.num_key_value_heads, config.head_dim);
    let batch = kv.lengths.len();
    ensure!(batch > 0, "attention_decode_paged: an empty batch");
    ensure!(kv.block_tables.len() == batch * kv.table_width, "attention_decode_paged: not one block table per row");
    ensure!(
        q.len() == batch * q_heads * head_dim,
        "attention_decode_paged: q is not [{batch}, {q_heads} x {head_dim}]"
    );
    ensure!(
        kv.k.len().is_multiple_of(kv.page_size * kv_heads * head_dim) && kv.v.len() == kv.k.len(),
        "attention_decode_paged: k or v is not [pages x {}, {kv_heads} x {head_dim}]",
        kv.page_size
    );
    ensure!(out.len() == q.len(), "attention_decode_paged: the output is not q's size");
    ensure!(split.splits >= 1 && split.splits <= MAX_SPLITS, "attention_decode_paged: {} splits", split.splits);
    ensure!(
        partials.len() >= batch * q_heads * split.splits * (head_dim + 2),
        "attention_decode_paged: the partial states do not fit"
    );
    check_decode_shape(config)?;
    gpu.poison(out)?;
    let launch = LaunchConfig {
        grid_dim: (kv_heads as u32, batch as u32, split.splits as u32),
        block_dim: (DECODE_THREADS as u32, 1, 1),
        shared_mem_bytes: decode_shared_bytes(config) as u32,
    };
    let scale = 1.0 / (head_dim as f32).sqrt();
    let group = (q_heads / kv_heads) as i32;
    let (table_width, page_size) = (kv.table_width as i32, kv.page_size as i32);
    ensure!(split.pages_per_split <= kv.table_width, "attention_decode_paged: a split wider than a block table");
    let pages_per_split = split.pages_per_split as i32;
    let (kv_heads, head_dim_arg) = (kv_heads as i32, head_dim as i32);
    // SAFETY: the arguments match the kernel's signature and the sizes checked above.
    unsafe {
        gpu.stream
            .launch_builder(&gpu.kernels.attention_decode_paged)
            .arg(q)
            .arg(&kv.k)
            .arg(&kv.v)
            .arg(&mut *out)
            .arg(&mut *partials)
            .arg(&kv.block_tables)
            .arg(&kv.lengths)
            .arg(&table_width)
            .arg(&page_size)
            .arg(&pages_per_split)
            .arg(&kv_heads)
            .arg(&head_dim_arg)
            .arg(&group)
            .arg(&scale)
            .launch(launch)
    }?;
    if split.splits > 1 {
        attention_merge(gpu, partials, out, batch, split.splits, q_heads, head_dim)?;
    }
    Ok(())
}

/// The splits' softmax states into the output: one block per (query head, row).
fn attention_merge(
    gpu: &Gpu,
    partials: &CudaSlice<f32>,
    out: &mut CudaViewMut<bf16>,
    batch: usize,
    splits: usize,
    q_heads: usize,
    head_dim: usize,
) -> Result<()> {
    let launch = LaunchConfig {
        grid_dim: (q_heads as u32, batch as u32, 1),
        block_dim: (head_dim.min(256) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (splits, head_dim) = (splits as i32, head_dim as i32);
    // SAFETY: the arguments match the kernel's signature; the caller checked the sizes.
    unsafe {
        gpu.stream
            .launch_builder(&gpu.kernels.attention_merge)
            .arg(partials)
            .arg(out)
            .arg(&splits)
            .arg(&head_dim)
            .launch(launch)
    }?;
    Ok(())
}
// ANCHOR_END: attention_decode_paged

// ANCHOR: kv_write
/// A pass's new keys and values `[rows, row_width]` into one layer of the pool `[pages ·
/// page_size, row_width]`: row r at pool row `cache_rows[r]`. The kernel trusts the rows to
/// be inside the pool: the scheduler computes them from pages it handed out.
pub fn kv_write(
    gpu: &Gpu,
    k_new: &CudaView<bf16>,
    v_new: &CudaView<bf16>,
    k_layer: &mut CudaViewMut<bf16>,
    v_layer: &mut CudaViewMut<bf16>,
    cache_rows: &CudaView<u32>,
    row_width: usize,
) -> Result<()> {
    let rows = cache_rows.len();
    ensure!(rows > 0, "kv_write: no rows");
    ensure!(
        k_new.len() == rows * row_width && v_new.len() == k_new.len(),
        "kv_write: new rows are not [{rows}, {row_width}]"
    );
    ensure!(
        k_layer.len().is_multiple_of(row_width) && v_layer.len() == k_layer.len(),
        "kv_write: the pool is not [pool rows, {row_width}]"
    );
    let launch = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    let row_width = row_width as i32;
    // SAFETY: the arguments match the kernel's signature and the sizes checked above.
    unsafe {
        gpu.stream
            .launch_builder(&gpu.kernels.kv_write)
            .arg(k_new)
            .arg(v_new)
            .arg(k_layer)
            .arg(v_layer)
            .arg(cache_rows)
            .arg(&row_width)
            .launch(launch)
    }?;
    Ok(())
}
// ANCHOR_END: kv_write

// ANCHOR: swiglu
/// The MLP's activation, in place: `gate = silu(gate) * up`, element by element.
pub fn swiglu(gpu: &Gpu, gate: &mut CudaViewMut<bf16>, up: &CudaView<bf16>) -> Result<()> {
    ensure!(gate.len() == up.len(), "swiglu: gate and up differ in size");
    let n = gate.len() as i32;
    let launch =
        LaunchConfig { grid_dim: (gate.len().div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match the kernel's signature; both buffers hold n values.
    unsafe { gpu.stream.launch_builder(&gpu.kernels.swiglu).arg(gate).arg(up).arg(&n).launch(launch) }?;
    Ok(())
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
pub fn lm_head(
    gpu: &Gpu,
    x: &CudaView<bf16>,
    w: &CudaSlice<bf16>,
    logits: &mut CudaViewMut<f32>,
    hidden: usize,
) -> Result<()> {
    ensure!(x.len().is_multiple_of(hidden) && w.len().is_multiple_of(hidden), "lm_head: rows are not {hidden} wide");
    let (rows, vocab) = (x.len() / hidden, w.len() / hidden);
    ensure!(logits.len() == rows * vocab, "lm_head: the logits are not [{rows}, {vocab}]");
    gpu.poison(logits)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (w_ptr, _w) = w.device_ptr(&gpu.stream);
    let (x_ptr, _x) = x.device_ptr(&gpu.stream);
    let (logits_ptr, _l) = logits.device_ptr_mut(&gpu.stream);
    // SAFETY: the sizes checked above describe exactly the three buffers; alpha and beta
    // are f32, as the fp32 compute type requires.
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
    Ok(())
}
// ANCHOR_END: lm_head

// ANCHOR: argmax
/// The index of the largest logit in each row of `[rows, vocab]`; `u32::MAX` for a row
/// holding NaN.
pub fn argmax(gpu: &Gpu, logits: &CudaView<f32>, out: &mut CudaViewMut<u32>, vocab: usize) -> Result<()> {
    ensure!(logits.len() == out.len() * vocab, "argmax: not one answer per row of {vocab} logits");
    gpu.poison(out)?;
    let launch = LaunchConfig { grid_dim: (out.len() as u32, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
    let vocab = vocab as i32;
    // SAFETY: the arguments match the kernel's signature and the sizes checked above.
    unsafe { gpu.stream.launch_builder(&gpu.kernels.argmax).arg(logits).arg(&vocab).arg(out).launch(launch) }?;
    Ok(())
}
// ANCHOR_END: argmax

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_sequence_alone_is_split_and_a_large_batch_is_not() {
        // One sequence of 2,000 positions (125 pages) of Llama 3.2 1B (8 KV heads) on an
        // H200's 132 multiprocessors: 8 blocks unsplit; 15 splits wanted, of 9 pages, so 14.
        assert_eq!(Split::choose(1, 125, 8, 132), Split { splits: 14, pages_per_split: 9 });
        assert_eq!(Split::choose(33, 125, 8, 132), Split::whole(125), "264 blocks fill the GPU twice already");
        assert_eq!(Split::choose(1, 7, 8, 132), Split::whole(7), "too short to split");
        for rows in 1..40 {
            for pages in 1..=128 {
                let split = Split::choose(rows, pages, 8, 132);
                assert!(split.splits <= MAX_SPLITS);
                assert!(split.splits * split.pages_per_split >= pages, "{split:?} misses pages of {pages}");
                assert!((split.splits - 1) * split.pages_per_split < pages, "{split:?} has an empty split");
            }
        }
    }
}
