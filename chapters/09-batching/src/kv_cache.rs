//! The KV cache: every layer's keys and values of every position processed so far, for
//! each of the engine's slots.
//!
//! A position's key and value depend only on its token and on the positions before it
//! (the causal mask), so once computed they never change. Chapter 7 recomputed them for the
//! whole sequence at every step; here each is computed once, written into the cache, and
//! read by every later step.
//!
//! Layout: for each layer, `slots` regions of `capacity` rows of `kv_heads · head_dim` bf16
//! values; in slot s, row p holds position p of the sequence in that slot, keys after RoPE.
//! A slot's rows are contiguous, so a prefill writes its prompt's rows in place and its
//! attention reads rows `0..len` as one matrix, as in chapter 8; a decode step's kernels
//! find each sequence's rows from its slot number.

use std::ops::Range;

use anyhow::{Result, ensure};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::bf16;

use crate::config::Config;
use crate::gpu::Gpu;

// ANCHOR: kv_cache
/// The sequences' keys and values for every layer, allocated once: `slots` sequences of up
/// to `capacity` positions each.
pub struct KvCache {
    /// Keys `[layers, slots, capacity, kv_heads · head_dim]`, after RoPE.
    pub k: CudaSlice<bf16>,
    /// Values, in the same layout.
    pub v: CudaSlice<bf16>,
    pub slots: usize,
    /// Positions each slot has room for, in each layer.
    pub capacity: usize,
    /// Values per row: `kv_heads · head_dim`.
    pub row_width: usize,
}

/// Bytes one position takes in every layer, keys and values: what each token of context
/// costs. For Llama 3.2 1B, 16 layers × 2 × 8 KV heads × 64 × 2 bytes = 32 KiB.
pub fn bytes_per_token(config: &Config) -> usize {
    config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * std::mem::size_of::<bf16>()
}

impl KvCache {
    pub fn new(gpu: &Gpu, config: &Config, slots: usize, capacity: usize) -> Result<Self> {
        let row_width = config.num_key_value_heads * config.head_dim;
        let values = config.num_hidden_layers * slots * capacity * row_width;
        Ok(KvCache { k: gpu.alloc_nan(values)?, v: gpu.alloc_nan(values)?, slots, capacity, row_width })
    }

    /// Bytes of GPU memory the cache holds, keys and values together.
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * std::mem::size_of::<bf16>()
    }

    /// The elements of layer `layer`'s rows `rows` of slot `slot`.
    fn span(&self, layer: usize, slot: usize, rows: Range<usize>) -> Result<Range<usize>> {
        ensure!(slot < self.slots, "slot {slot} is past the cache's {} slots", self.slots);
        ensure!(rows.end <= self.capacity, "position {} is past the cache's {} positions", rows.end, self.capacity);
        let start = ((layer * self.slots + slot) * self.capacity + rows.start) * self.row_width;
        Ok(start..start + rows.len() * self.row_width)
    }

    /// Layer `layer`'s keys and values at positions `rows` of slot `slot`, to write.
    pub fn rows_mut(
        &mut self,
        layer: usize,
        slot: usize,
        rows: Range<usize>,
    ) -> Result<(CudaViewMut<'_, bf16>, CudaViewMut<'_, bf16>)> {
        let span = self.span(layer, slot, rows)?;
        Ok((self.k.slice_mut(span.clone()), self.v.slice_mut(span)))
    }

    /// Layer `layer`'s keys and values at positions `rows` of slot `slot`, to read.
    pub fn rows(
        &self,
        layer: usize,
        slot: usize,
        rows: Range<usize>,
    ) -> Result<(CudaView<'_, bf16>, CudaView<'_, bf16>)> {
        let span = self.span(layer, slot, rows)?;
        Ok((self.k.slice(span.clone()), self.v.slice(span)))
    }

    /// Under `--check` (see [`Gpu::poison`]), fills every layer's rows of `slot` with NaN
    /// before a new sequence takes it. The cache starts as NaN, but a reused slot holds its
    /// previous sequence's keys and values, real numbers: a kernel reading a row its own
    /// sequence never wrote would get plausible, wrong values instead of NaN. Without
    /// `--check` it does nothing.
    pub fn poison_slot(&mut self, gpu: &Gpu, slot: usize) -> Result<()> {
        let layers = self.k.len() / (self.slots * self.capacity * self.row_width);
        for layer in 0..layers {
            let (mut k, mut v) = self.rows_mut(layer, slot, 0..self.capacity)?;
            gpu.poison(&mut k)?;
            gpu.poison(&mut v)?;
        }
        Ok(())
    }

    /// Every slot of layer `layer`, for the kernels of a decode step, which find each
    /// sequence's rows by its slot.
    pub fn layer(&self, layer: usize) -> (CudaView<'_, bf16>, CudaView<'_, bf16>) {
        let size = self.slots * self.capacity * self.row_width;
        let span = layer * size..(layer + 1) * size;
        (self.k.slice(span.clone()), self.v.slice(span))
    }

    /// [`KvCache::layer`], to write.
    pub fn layer_mut(&mut self, layer: usize) -> (CudaViewMut<'_, bf16>, CudaViewMut<'_, bf16>) {
        let size = self.slots * self.capacity * self.row_width;
        let span = layer * size..(layer + 1) * size;
        (self.k.slice_mut(span.clone()), self.v.slice_mut(span))
    }
}
// ANCHOR_END: kv_cache
