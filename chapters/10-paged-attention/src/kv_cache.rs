//! The KV cache: every layer's keys and values of every position processed so far, for
//! every sequence, in one pool of pages that the sequences share.
//!
//! A position's key and value depend only on its token and on the positions before it
//! (the causal mask), so once computed they never change. Chapter 7 recomputed them for the
//! whole sequence at every step; since chapter 8 each is computed once, written into the
//! cache, and read by every later step.
//!
//! Chapter 9 gave every slot a region for a whole context, 64 MiB for Llama 3.2 1B, however
//! short its request. Here the cache is `pages` pages of [`PAGE_SIZE`] positions, and a
//! sequence holds only the pages its positions fill, wherever they are in the pool: its
//! block table (see `page_pool.rs`) says which. A page number means the same page in every
//! layer: page n is rows `n · PAGE_SIZE ..` of each layer's part of the pool. So one block
//! table serves all the layers, and a page is taken once per sequence, not once per layer.
//!
//! Layout: for each layer, `pages · PAGE_SIZE` rows of `kv_heads · head_dim` bf16 values;
//! pool row `page · PAGE_SIZE + offset` holds a position of whichever sequence holds `page`,
//! keys after RoPE.

use anyhow::{Result, ensure};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::bf16;

use crate::config::Config;
use crate::gpu::Gpu;
use crate::page_pool::PAGE_SIZE;

// ANCHOR: kv_cache
/// The pool of pages holding every sequence's keys and values, allocated once.
pub struct KvCache {
    /// Keys `[layers, pages · PAGE_SIZE, kv_heads · head_dim]`, after RoPE.
    pub k: CudaSlice<bf16>,
    /// Values, in the same layout.
    pub v: CudaSlice<bf16>,
    pub pages: usize,
    pub layers: usize,
    /// Values per row: `kv_heads · head_dim`.
    pub row_width: usize,
}

/// Bytes one position takes in every layer, keys and values: what each token of context
/// costs. For Llama 3.2 1B, 16 layers × 2 × 8 KV heads × 64 × 2 bytes = 32 KiB.
pub fn bytes_per_token(config: &Config) -> usize {
    config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * std::mem::size_of::<bf16>()
}

/// Bytes of one page: [`PAGE_SIZE`] positions in every layer (512 KiB for Llama 3.2 1B).
pub fn bytes_per_page(config: &Config) -> usize {
    PAGE_SIZE * bytes_per_token(config)
}

/// Whole pages in a pool of `mib` MiB; an error when not even one fits.
pub fn pages_in(mib: usize, config: &Config) -> Result<usize> {
    let page = bytes_per_page(config);
    let pages = mib * 1024 * 1024 / page;
    ensure!(
        pages > 0,
        "a KV cache of {mib} MiB holds no page: a page of {PAGE_SIZE} positions takes {} KiB for this model (raise --kv-cache-mib)",
        page / 1024
    );
    Ok(pages)
}

impl KvCache {
    pub fn new(gpu: &Gpu, config: &Config, pages: usize) -> Result<Self> {
        let row_width = config.num_key_value_heads * config.head_dim;
        let layers = config.num_hidden_layers;
        let values = layers * pages * PAGE_SIZE * row_width;
        Ok(KvCache { k: gpu.alloc_nan(values)?, v: gpu.alloc_nan(values)?, pages, layers, row_width })
    }

    /// Bytes of GPU memory the cache holds, keys and values together.
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * std::mem::size_of::<bf16>()
    }

    /// Values in one layer's part of the pool.
    fn layer_size(&self) -> usize {
        self.pages * PAGE_SIZE * self.row_width
    }

    /// Layer `layer`'s part of the pool, keys and values: every page, for the kernels,
    /// which find each sequence's rows through its block table.
    pub fn layer(&self, layer: usize) -> (CudaView<'_, bf16>, CudaView<'_, bf16>) {
        let span = layer * self.layer_size()..(layer + 1) * self.layer_size();
        (self.k.slice(span.clone()), self.v.slice(span))
    }

    /// [`KvCache::layer`], to write.
    pub fn layer_mut(&mut self, layer: usize) -> (CudaViewMut<'_, bf16>, CudaViewMut<'_, bf16>) {
        let span = layer * self.layer_size()..(layer + 1) * self.layer_size();
        (self.k.slice_mut(span.clone()), self.v.slice_mut(span))
    }

    /// The elements of page `page` in layer `layer`.
    fn page_span(&self, layer: usize, page: u32) -> Result<std::ops::Range<usize>> {
        ensure!((page as usize) < self.pages, "page {page} is outside the pool of {}", self.pages);
        let start = layer * self.layer_size() + page as usize * PAGE_SIZE * self.row_width;
        Ok(start..start + PAGE_SIZE * self.row_width)
    }

    /// Under `--check` (see [`Gpu::poison`]), fills every layer of `pages` with NaN as a
    /// finished sequence gives them back. A page taken again holds its last owner's keys and
    /// values otherwise, real numbers: a kernel reading a row its new sequence never wrote
    /// would get plausible, wrong values instead of NaN. Without `--check` it does nothing.
    pub fn poison_pages(&mut self, gpu: &Gpu, pages: &[u32]) -> Result<()> {
        if !gpu.poison_outputs {
            return Ok(());
        }
        for layer in 0..self.layers {
            for &page in pages {
                let span = self.page_span(layer, page)?;
                gpu.poison(&mut self.k.slice_mut(span.clone()))?;
                gpu.poison(&mut self.v.slice_mut(span))?;
            }
        }
        Ok(())
    }

    /// Layer `layer`'s keys and values of positions `0..positions` of the sequence with
    /// `block_table`, gathered page by page into the host as one contiguous matrix each
    /// (`[positions, row_width]`): chapter 8's cache, for `--check` to compare.
    pub fn gather(
        &self,
        gpu: &Gpu,
        layer: usize,
        block_table: &[u32],
        positions: usize,
    ) -> Result<(Vec<bf16>, Vec<bf16>)> {
        ensure!(positions <= block_table.len() * PAGE_SIZE, "{positions} positions, but {} pages", block_table.len());
        let (mut keys, mut values) = (Vec::with_capacity(positions * self.row_width), Vec::new());
        values.reserve(positions * self.row_width);
        for (index, &page) in block_table.iter().enumerate().take(positions.div_ceil(PAGE_SIZE)) {
            let rows = (positions - index * PAGE_SIZE).min(PAGE_SIZE);
            let span = self.page_span(layer, page)?;
            let span = span.start..span.start + rows * self.row_width;
            keys.extend(gpu.stream.clone_dtoh(&self.k.slice(span.clone()))?);
            values.extend(gpu.stream.clone_dtoh(&self.v.slice(span))?);
        }
        Ok((keys, values))
    }
}
// ANCHOR_END: kv_cache
