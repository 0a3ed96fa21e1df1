//! The model on the GPU: its weights, its shape, the activation buffers its forward pass
//! writes, and the KV cache, all allocated once for the most tokens the program runs.
//!
//! Each decoder layer is two sublayers that add to the residual stream `x`:
//!
//! ```text
//! x += o_proj(attention(rope(q), rope(k), v))   with q, k, v projected from rms_norm(x)
//! x += down_proj(silu(gate_proj(h)) * up_proj(h))   with h = rms_norm(x)
//! ```
//!
//! A pass runs either one sequence's whole prompt from position 0 (the *prefill*, chapter
//! 7's forward pass) or one new token of each sequence of a batch, each at its own next
//! position (a *decode* step). Both write each position's keys and values into the pages
//! of its sequence in the pool, through the pass's cache rows, and a decode step's attention
//! reads them from there through each sequence's block table. In a decode step every matrix
//! product is one product for the whole batch: the weights are read once for all the
//! sequences.
//!
//! Chapter by chapter this grows into llama2.c's `Transformer` and `RunState` in one: each
//! chapter adds the buffers and the steps it teaches, never parameters threaded through
//! every call.

use anyhow::{Result, ensure};
use cudarc::driver::{CudaSlice, CudaView};
use half::bf16;

use crate::config::Config;
use crate::gpu::Gpu;
use crate::kv_cache::KvCache;
use crate::ops::{self, PagedKv, Split};
use crate::page_pool::{PAGE_SIZE, cache_row, pages_for};
use crate::rope;
use crate::scheduler::StepBatch;
use crate::weights::Weights;

// ANCHOR: model
/// Everything the forward pass needs, owned in one place.
pub struct Model {
    pub gpu: Gpu,
    pub weights: Weights,
    pub config: Config,
    pub act: Activations,
    /// RoPE's rotation speed of each pair of a head `[head_dim / 2]` (see `rope.rs`).
    pub inv_freq: CudaSlice<f32>,
    /// Every sequence's keys and values of the positions processed so far, in pages.
    pub cache: KvCache,
    /// A pass's cache rows, and a decode step's batch description, on the GPU.
    pub batch: BatchBuffers,
    /// The most positions a sequence may hold, prompt and generated tokens together.
    pub context: usize,
    /// Whether a decode step may split long sequences' positions among blocks
    /// (flash-decoding; see [`Split::choose`]). On by default; `--no-split-kv` turns it off.
    pub split_kv: bool,
    /// How many tokens the activations hold now (the first `rows` rows of each buffer).
    pub rows: usize,
    /// Pages of the longest sequence of the last decode step.
    pub longest_pages: usize,
    /// What they are: one sequence's prompt, or one token of each sequence of a batch.
    pub pass: Pass,
}

/// The kind of forward pass the activations hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// One sequence's prompt, positions 0, 1, 2, …
    Prefill,
    /// One token of each row of the step's batch, at the rows' own positions.
    Decode,
}

/// The forward pass's working memory, each buffer sized for `max_rows` tokens.
pub struct Activations {
    pub max_rows: usize,
    /// The token ids `[max_rows]`.
    pub ids: CudaSlice<u32>,
    /// Every position `[max_rows]`: 0, 1, 2, … A pass starting at position `start` reads
    /// its rows' positions from `positions[start..]`, so a decode step uploads none.
    pub positions: CudaSlice<u32>,
    /// The residual stream `[max_rows, hidden]`: each token's row of numbers.
    pub x: CudaSlice<bf16>,
    /// A sublayer's normalized input `[max_rows, hidden]`.
    pub normed: CudaSlice<bf16>,
    /// Queries `[max_rows, q_heads · head_dim]`, and the pass's new keys and values `[max_rows,
    /// kv_heads · head_dim]`, which are then copied to their pages (a prefill's attention reads
    /// its prompt's from here, where they are one contiguous matrix).
    pub q: CudaSlice<bf16>,
    pub k: CudaSlice<bf16>,
    pub v: CudaSlice<bf16>,
    /// Attention's output before its projection `[max_rows, q_heads · head_dim]`.
    pub attended: CudaSlice<bf16>,
    /// A split decode attention's softmax states `[max_batch, q_heads, MAX_SPLITS, head_dim + 2]`.
    pub partials: CudaSlice<f32>,
    /// The MLP's two widenings `[max_rows, intermediate]`; the activation overwrites `gate`.
    pub gate: CudaSlice<bf16>,
    pub up: CudaSlice<bf16>,
    /// The fp32 logits of each sequence's last position `[max_batch, vocab]` (one row after
    /// a prefill), and the ids chosen from them `[max_batch]`.
    pub logits: CudaSlice<f32>,
    pub next: CudaSlice<u32>,
}
// ANCHOR_END: model

// ANCHOR: batch_buffers
/// A pass's description on the GPU. For a decode step, for each row: its token id, its
/// position, the pool row its key and value go to, how many positions it attends to, and its
/// block table. For a prefill, the pool row of each prompt position. Allocated once, for
/// `max_batch` rows of block tables `table_width` pages wide and prompts of `max_rows`, and
/// uploaded with one copy per pass from host buffers that are reused.
pub struct BatchBuffers {
    pub max_batch: usize,
    pub table_width: usize,
    /// `[4, max_batch]`: ids, positions, cache rows, lengths, each a `max_batch`-long
    /// section; then `[max_batch, table_width]` block tables.
    pub table: CudaSlice<u32>,
    host: Vec<u32>,
    /// A prefill's cache rows `[max_rows]`.
    pub prompt_rows: CudaSlice<u32>,
    prompt_host: Vec<u32>,
    /// The ids the last pass chose, one per row, copied back.
    chosen: Vec<u32>,
}

impl BatchBuffers {
    fn new(gpu: &Gpu, max_batch: usize, table_width: usize, max_rows: usize) -> Result<Self> {
        let entries = 4 * max_batch + max_batch * table_width;
        Ok(BatchBuffers {
            max_batch,
            table_width,
            table: gpu.alloc_nan(entries)?,
            host: vec![0; entries],
            prompt_rows: gpu.alloc_nan(max_rows)?,
            prompt_host: vec![0; max_rows],
            chosen: vec![0; max_batch],
        })
    }

    /// Section `section` (0 ids, 1 positions, 2 cache rows, 3 lengths), its first `rows` entries.
    fn section(&self, section: usize, rows: usize) -> CudaView<'_, u32> {
        self.table.slice(section * self.max_batch..section * self.max_batch + rows)
    }

    /// The block tables of the first `rows` rows.
    fn block_tables(&self, rows: usize) -> CudaView<'_, u32> {
        let start = 4 * self.max_batch;
        self.table.slice(start..start + rows * self.table_width)
    }

    /// Copies `batch` to the GPU: no allocation, one host-to-device copy of the four
    /// sections and the rows' block tables.
    fn upload(&mut self, gpu: &Gpu, batch: &StepBatch) -> Result<()> {
        let (rows, max) = (batch.len(), self.max_batch);
        self.host[..rows].copy_from_slice(&batch.ids);
        self.host[max..max + rows].copy_from_slice(&batch.positions);
        self.host[2 * max..2 * max + rows].copy_from_slice(&batch.cache_rows);
        for (length, position) in self.host[3 * max..3 * max + rows].iter_mut().zip(&batch.positions) {
            *length = position + 1; // a row attends to every position up to its own
        }
        let tables = 4 * max..4 * max + rows * self.table_width;
        self.host[tables.clone()].copy_from_slice(&batch.block_tables);
        gpu.stream.memcpy_htod(&self.host[..tables.end], &mut self.table.slice_mut(..tables.end))?;
        Ok(())
    }

    /// Copies the pool rows of a prompt of `tokens` positions, in the pages of `block_table`,
    /// to the GPU.
    fn upload_prompt(&mut self, gpu: &Gpu, block_table: &[u32], tokens: usize) -> Result<()> {
        for (position, row) in self.prompt_host[..tokens].iter_mut().enumerate() {
            *row = cache_row(block_table, position);
        }
        gpu.stream.memcpy_htod(&self.prompt_host[..tokens], &mut self.prompt_rows.slice_mut(..tokens))?;
        Ok(())
    }
}
// ANCHOR_END: batch_buffers

/// The two halves of a decoder layer, as a hook on the forward pass sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sublayer {
    Attention,
    Mlp,
}

/// When a hook is called: just before a sublayer runs, or just after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    Before,
    After,
}

impl Activations {
    /// Allocates every buffer once; they start as NaN (see [`Gpu::alloc_nan`]).
    fn new(gpu: &Gpu, config: &Config, max_rows: usize, max_batch: usize) -> Result<Self> {
        let partial_states = max_batch * config.num_attention_heads * ops::MAX_SPLITS * (config.head_dim + 2);
        let q_dim = config.num_attention_heads * config.head_dim;
        let kv_dim = config.num_key_value_heads * config.head_dim;
        let positions: Vec<u32> = (0..max_rows as u32).collect();
        Ok(Activations {
            max_rows,
            ids: gpu.alloc_nan(max_rows)?,
            positions: gpu.stream.clone_htod(&positions)?,
            x: gpu.alloc_nan(max_rows * config.hidden_size)?,
            normed: gpu.alloc_nan(max_rows * config.hidden_size)?,
            q: gpu.alloc_nan(max_rows * q_dim)?,
            k: gpu.alloc_nan(max_rows * kv_dim)?,
            v: gpu.alloc_nan(max_rows * kv_dim)?,
            attended: gpu.alloc_nan(max_rows * q_dim)?,
            partials: gpu.alloc_nan(partial_states)?,
            gate: gpu.alloc_nan(max_rows * config.intermediate_size)?,
            up: gpu.alloc_nan(max_rows * config.intermediate_size)?,
            logits: gpu.alloc_nan(max_batch * config.vocab_size)?,
            next: gpu.alloc_nan(max_batch)?,
        })
    }
}

impl Model {
    /// A model with a pool of `pages` pages for sequences of up to `context` positions, and
    /// buffers for a prompt of `context` tokens or a decode step of `max_batch` rows.
    pub fn new(
        gpu: Gpu,
        weights: Weights,
        config: Config,
        context: usize,
        max_batch: usize,
        pages: usize,
    ) -> Result<Self> {
        let max_rows = context.max(max_batch);
        let act = Activations::new(&gpu, &config, max_rows, max_batch)?;
        let inv_freq = gpu.stream.clone_htod(&rope::inverse_frequencies(&config))?;
        let cache = KvCache::new(&gpu, &config, pages)?;
        let batch = BatchBuffers::new(&gpu, max_batch, pages_for(context), max_rows)?;
        let pass = Pass::Decode;
        Ok(Model {
            gpu,
            weights,
            config,
            act,
            inv_freq,
            cache,
            batch,
            context,
            split_kv: true,
            rows: 0,
            longest_pages: 0,
            pass,
        })
    }

    // ANCHOR: embed_tokens
    /// Copies the token ids to the GPU and gathers their embedding rows into `x`.
    pub fn embed(&mut self, ids: &[u32]) -> Result<()> {
        let Model { gpu, weights, config, act, rows, .. } = self;
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

    /// The embedding rows of a decode step's ids, already on the GPU in the batch table.
    fn embed_batch(&mut self) -> Result<()> {
        let Model { gpu, weights, config, act, batch, rows, .. } = self;
        let hidden = config.hidden_size;
        let ids = batch.section(0, *rows);
        ops::embedding(gpu, &weights.embed_tokens, &ids, &mut act.x.slice_mut(..*rows * hidden), hidden)
    }
    // ANCHOR_END: embed_tokens

    // ANCHOR: input_norm
    /// Layer `layer`'s `input_layernorm` of the stream: `normed = rms_norm(x)`, what the
    /// attention sublayer's projections read.
    pub fn input_norm(&mut self, layer: usize) -> Result<()> {
        let Model { gpu, weights, config, act, rows, .. } = self;
        let n = *rows * config.hidden_size;
        let weight = &weights.layers[layer].input_layernorm;
        let (x, mut normed) = (act.x.slice(..n), act.normed.slice_mut(..n));
        ops::rms_norm(gpu, &x, weight, &mut normed, config.hidden_size, config.rms_norm_eps)
    }
    // ANCHOR_END: input_norm

    // ANCHOR: project_qkv
    /// Layer `layer`'s query, key and value projections of `normed`: three matrix products,
    /// each one product for all the pass's rows, into `q`, `k` and `v`.
    pub fn project_qkv(&mut self, layer: usize) -> Result<()> {
        let Model { gpu, weights, config, act, cache, rows, .. } = self;
        let weights = &weights.layers[layer];
        let hidden = config.hidden_size;
        let (q_dim, kv_dim) = (config.num_attention_heads * config.head_dim, cache.row_width);
        let normed = act.normed.slice(..*rows * hidden);
        ops::linear(gpu, &normed, &weights.q_proj, &mut act.q.slice_mut(..*rows * q_dim), hidden)?;
        ops::linear(gpu, &normed, &weights.k_proj, &mut act.k.slice_mut(..*rows * kv_dim), hidden)?;
        ops::linear(gpu, &normed, &weights.v_proj, &mut act.v.slice_mut(..*rows * kv_dim), hidden)
    }

    /// RoPE on the queries and on the new keys, in place: each row turned by its absolute
    /// position (in a decode step, each row's own, from the batch table).
    pub fn rotate_qk(&mut self) -> Result<()> {
        let Model { gpu, config, act, cache, batch, inv_freq, rows, pass, .. } = self;
        let (q_heads, kv_heads, head_dim) = (config.num_attention_heads, config.num_key_value_heads, config.head_dim);
        let positions = match *pass {
            Pass::Prefill => act.positions.slice(..*rows),
            Pass::Decode => batch.section(1, *rows),
        };
        let mut q = act.q.slice_mut(..*rows * q_heads * head_dim);
        ops::rope(gpu, &mut q, &positions, inv_freq, q_heads, head_dim)?;
        let mut k = act.k.slice_mut(..*rows * cache.row_width);
        ops::rope(gpu, &mut k, &positions, inv_freq, kv_heads, head_dim)
    }

    /// The pass's new keys and values into their pages: row r to the pool row the pass's
    /// cache rows give it (a prefill's from its block table, a decode step's from the batch).
    fn write_kv(&mut self, layer: usize) -> Result<()> {
        let Model { gpu, act, cache, batch, rows, pass, .. } = self;
        let width = cache.row_width;
        let (k_new, v_new) = (act.k.slice(..*rows * width), act.v.slice(..*rows * width));
        let cache_rows = match *pass {
            Pass::Prefill => batch.prompt_rows.slice(..*rows),
            Pass::Decode => batch.section(2, *rows),
        };
        let (mut k_layer, mut v_layer) = cache.layer_mut(layer);
        ops::kv_write(gpu, &k_new, &v_new, &mut k_layer, &mut v_layer, &cache_rows, width)
    }
    // ANCHOR_END: project_qkv

    // ANCHOR: attention_sublayer
    /// Layer `layer`'s attention sublayer: `x += o_proj(attention(x))`. Every step's
    /// result stays in its buffer (`normed`, `q`, `attended`, the cache) until the next
    /// sublayer writes it.
    pub fn attention_sublayer(&mut self, layer: usize) -> Result<()> {
        self.attention(layer)?;
        let Model { gpu, weights, config, act, rows, .. } = self;
        let q_dim = config.num_attention_heads * config.head_dim;
        let attended = act.attended.slice(..*rows * q_dim);
        let mut x = act.x.slice_mut(..*rows * config.hidden_size);
        ops::linear_add(gpu, &attended, &weights.layers[layer].o_proj, &mut x, q_dim)
    }

    /// Attention before its output projection: `attended = attention(rope(q), rope(k), v)`
    /// with q, k, v projected from `rms_norm(x)`, each row over every cached position of
    /// its sequence up to its own: chapter 6's kernel for a prefill, on the prompt's keys
    /// and values as they were computed; the paged decode kernel for a decode step.
    pub fn attention(&mut self, layer: usize) -> Result<()> {
        self.input_norm(layer)?;
        self.project_qkv(layer)?;
        self.rotate_qk()?;
        self.write_kv(layer)?;
        let split = self.split();
        let Model { gpu, config, act, cache, batch, rows, pass, .. } = self;
        let (q_dim, kv_dim) = (config.num_attention_heads * config.head_dim, cache.row_width);
        let q = act.q.slice(..*rows * q_dim);
        let mut attended = act.attended.slice_mut(..*rows * q_dim);
        match *pass {
            Pass::Prefill => {
                // Row i is position i of the prompt and attends to positions 0..=i.
                let (k, v) = (act.k.slice(..*rows * kv_dim), act.v.slice(..*rows * kv_dim));
                ops::attention_prefill(gpu, &q, &k, &v, &mut attended, config)
            }
            Pass::Decode => {
                let (k, v) = cache.layer(layer);
                let kv = PagedKv {
                    k,
                    v,
                    block_tables: batch.block_tables(*rows),
                    lengths: batch.section(3, *rows),
                    table_width: batch.table_width,
                    page_size: PAGE_SIZE,
                };
                ops::attention_decode_paged(gpu, &q, &kv, &mut attended, &mut act.partials, split, config)
            }
        }
    }

    /// How this decode step's attention splits its sequences' positions: by the longest
    /// sequence of the step (`longest_pages`, set by [`Model::decode`]).
    fn split(&self) -> Split {
        if self.split_kv {
            Split::choose(self.rows, self.longest_pages, self.config.num_key_value_heads, self.gpu.multiprocessors)
        } else {
            Split::whole(self.longest_pages)
        }
    }
    // ANCHOR_END: attention_sublayer

    // ANCHOR: mlp_sublayer
    /// Layer `layer`'s MLP sublayer: `x += down_proj(mlp_activation(x))`.
    pub fn mlp_sublayer(&mut self, layer: usize) -> Result<()> {
        self.mlp_activation(layer)?;
        let Model { gpu, weights, config, act, rows, .. } = self;
        let ffn = config.intermediate_size;
        let activation = act.gate.slice(..*rows * ffn);
        let mut x = act.x.slice_mut(..*rows * config.hidden_size);
        ops::linear_add(gpu, &activation, &weights.layers[layer].down_proj, &mut x, ffn)
    }

    /// The MLP before its down projection: `silu(gate_proj(h)) * up_proj(h)` with
    /// `h = rms_norm(x)`: widen to 8,192 twice and gate one with the other (into `gate`).
    pub fn mlp_activation(&mut self, layer: usize) -> Result<()> {
        self.post_attention_norm(layer)?;
        let Model { gpu, weights, config, act, rows, .. } = self;
        let layer = &weights.layers[layer];
        let (hidden, ffn) = (config.hidden_size, config.intermediate_size);
        let normed = act.normed.slice(..*rows * hidden);
        let (mut gate, mut up) = (act.gate.slice_mut(..*rows * ffn), act.up.slice_mut(..*rows * ffn));
        ops::linear(gpu, &normed, &layer.gate_proj, &mut gate, hidden)?;
        ops::linear(gpu, &normed, &layer.up_proj, &mut up, hidden)?;
        ops::swiglu(gpu, &mut gate, &up.as_view())
    }

    /// Layer `layer`'s `post_attention_layernorm` of the stream, into `normed`.
    fn post_attention_norm(&mut self, layer: usize) -> Result<()> {
        let Model { gpu, weights, config, act, rows, .. } = self;
        let n = *rows * config.hidden_size;
        let weight = &weights.layers[layer].post_attention_layernorm;
        let (x, mut normed) = (act.x.slice(..n), act.normed.slice_mut(..n));
        ops::rms_norm(gpu, &x, weight, &mut normed, config.hidden_size, config.rms_norm_eps)
    }
    // ANCHOR_END: mlp_sublayer

    // ANCHOR: forward
    /// The prefill: runs the sequence `ids` (positions 0, 1, …) through the whole model,
    /// writes their keys and values into the pages of `block_table`, and leaves the fp32
    /// logits of its last position in the first row of `act.logits`: the scores of every
    /// possible next token.
    pub fn forward(&mut self, block_table: &[u32], ids: &[u32]) -> Result<()> {
        self.forward_with_hook(block_table, ids, |_, _, _, _| Ok(()))
    }

    /// [`Model::forward`], calling `hook` just before and just after every sublayer with the
    /// model as it is then. `--check` reads the buffers there, so the forward pass it checks
    /// is this one, not a copy of it.
    pub fn forward_with_hook(
        &mut self,
        block_table: &[u32],
        ids: &[u32],
        mut hook: impl FnMut(&Model, usize, Sublayer, Moment) -> Result<()>,
    ) -> Result<()> {
        ensure!(!ids.is_empty(), "the forward pass needs at least one token");
        ensure!(ids.len() <= self.context, "{} tokens, but a sequence holds {}", ids.len(), self.context);
        // The kernel trusts the cache rows; a page past the pool would write outside it.
        ensure!(block_table.len() >= pages_for(ids.len()), "{} tokens, but {} pages", ids.len(), block_table.len());
        ensure!(
            block_table.iter().all(|&page| (page as usize) < self.cache.pages),
            "a page is past the pool's {}",
            self.cache.pages
        );
        self.pass = Pass::Prefill;
        self.embed(ids)?;
        self.batch.upload_prompt(&self.gpu, block_table, ids.len())?;
        for layer in 0..self.config.num_hidden_layers {
            for sublayer in [Sublayer::Attention, Sublayer::Mlp] {
                hook(self, layer, sublayer, Moment::Before)?;
                match sublayer {
                    Sublayer::Attention => self.attention_sublayer(layer)?,
                    Sublayer::Mlp => self.mlp_sublayer(layer)?,
                }
                hook(self, layer, sublayer, Moment::After)?;
            }
        }
        self.final_logits()
    }

    // ANCHOR: decode
    /// A decode step: runs one new token of every row of `batch`, each at its own position
    /// of its own sequence. Their keys and values join their pages, each row's attention
    /// reads its own sequence's cached positions through its block table, and the logits of
    /// what follows each token are left in row i of `act.logits`. No allocation: one copy
    /// of the batch table to the GPU.
    pub fn decode(&mut self, batch: &StepBatch) -> Result<()> {
        let rows = batch.len();
        ensure!(
            rows > 0 && rows <= self.batch.max_batch,
            "a batch of {rows}, but the buffers hold {}",
            self.batch.max_batch
        );
        self.validate(batch)?;
        self.batch.upload(&self.gpu, batch)?;
        self.pass = Pass::Decode;
        self.rows = rows;
        let longest = batch.positions.iter().max().map_or(0, |&p| p as usize + 1);
        self.longest_pages = pages_for(longest);
        self.embed_batch()?;
        for layer in 0..self.config.num_hidden_layers {
            self.attention_sublayer(layer)?;
            self.mlp_sublayer(layer)?;
        }
        self.final_logits()
    }
    // ANCHOR_END: decode

    /// The kernels trust the batch table; a page or pool row past the pool would reach
    /// outside it, and a position past a sequence's pages would read pages it does not hold.
    fn validate(&self, batch: &StepBatch) -> Result<()> {
        let (pages, width) = (self.cache.pages, self.batch.table_width);
        ensure!(batch.table_width == width, "block tables {} wide, but the buffers' are {width}", batch.table_width);
        ensure!(
            batch.ids.iter().all(|&id| (id as usize) < self.config.vocab_size),
            "a token id is outside the vocabulary"
        );
        ensure!(
            batch.cache_rows.iter().all(|&row| (row as usize) < pages * PAGE_SIZE),
            "a cache row is past the pool's {pages} pages"
        );
        for (row, &position) in batch.positions.iter().enumerate() {
            let held = &batch.block_tables[row * width..][..pages_for(position as usize + 1).min(width)];
            ensure!((position as usize) < width * PAGE_SIZE, "position {position} is past a sequence's {width} pages");
            ensure!(
                held.iter().all(|&page| (page as usize) < pages),
                "a block table names a page past the pool's {pages}"
            );
        }
        Ok(())
    }

    /// Rows of `act.logits` the last pass wrote: one after a prefill, one per row after a
    /// decode step.
    pub fn logit_rows(&self) -> usize {
        match self.pass {
            Pass::Prefill => 1,
            Pass::Decode => self.rows,
        }
    }

    /// The final norm and the LM head, for the last position of each sequence only: its
    /// logits are all that choosing the next token needs.
    fn final_logits(&mut self) -> Result<()> {
        let sequences = self.logit_rows();
        let Model { gpu, weights, config, act, rows, .. } = self;
        let (hidden, vocab) = (config.hidden_size, config.vocab_size);
        let first = *rows - sequences; // a prefill's last row; all of a decode step's
        let last_rows = act.x.slice(first * hidden..*rows * hidden);
        let mut normed = act.normed.slice_mut(..sequences * hidden);
        ops::rms_norm(gpu, &last_rows, &weights.norm, &mut normed, hidden, config.rms_norm_eps)?;
        let lm_head = weights.lm_head.as_ref().unwrap_or(&weights.embed_tokens);
        let normed = act.normed.slice(..sequences * hidden);
        ops::lm_head(gpu, &normed, lm_head, &mut act.logits.slice_mut(..sequences * vocab), hidden)
    }
    // ANCHOR_END: forward

    // ANCHOR: next_token
    /// The most likely next token of each sequence of the last pass: argmax on the GPU, and
    /// one copy back of one id per sequence, which waits for the GPU to finish.
    pub fn next_tokens(&mut self) -> Result<&[u32]> {
        let sequences = self.logit_rows();
        let Model { gpu, config, act, batch, .. } = self;
        let vocab = config.vocab_size;
        let logits = act.logits.slice(..sequences * vocab);
        ops::argmax(gpu, &logits, &mut act.next.slice_mut(..sequences), vocab)?;
        let chosen = &mut batch.chosen[..sequences];
        gpu.stream.memcpy_dtoh(&act.next.slice(..sequences), chosen)?;
        ensure!(chosen.iter().all(|&id| (id as usize) < vocab), "the logits contain NaN: the forward pass went wrong");
        Ok(chosen)
    }
    // ANCHOR_END: next_token

    /// Row `row` of the last pass's logits, copied to the host (for `--check`).
    pub fn logits_row(&self, row: usize) -> Result<Vec<f32>> {
        let vocab = self.config.vocab_size;
        ensure!(row < self.logit_rows(), "the last pass wrote {} rows of logits", self.logit_rows());
        Ok(self.gpu.stream.clone_dtoh(&self.act.logits.slice(row * vocab..(row + 1) * vocab))?)
    }

    /// The rows in use of one of the activation buffers of `max_rows` rows (not the
    /// `max_batch`-row ones), copied to the host as f32.
    pub fn read(&self, buffer: &CudaSlice<bf16>) -> Result<Vec<f32>> {
        let width = buffer.len() / self.act.max_rows;
        let values = self.gpu.stream.clone_dtoh(&buffer.slice(..self.rows * width))?;
        Ok(values.iter().map(|v| v.to_f32()).collect())
    }
}

/// bf16 roundings between the attention sublayer's input and its change to the stream,
/// counted once on every path: the normed input (on the value's path, the query's and the
/// key's), q, k and v, RoPE of q and of k, the attention output, and the change itself
/// (o_proj's product). The check's limits use it.
pub const ATTENTION_ROUNDINGS: usize = 10;
/// The same for the MLP: the normed input (on the gate's path and the up path), gate and
/// up, the activation, and the change (down_proj's product).
pub const MLP_ROUNDINGS: usize = 6;
