//! Chapter 10 under the benchmark: many sequences at once, their keys and values in one
//! pool of pages, through the chapter's library.
//!
//! The model gets buffers for [`MAX_BATCH`] sequences and a pool large enough that every
//! request of the largest batch is admitted at once (see [`pool_pages`]), so that its
//! figures compare with chapter 9's; its end tokens are cleared, so that every request
//! generates exactly its budget (the bench's rule). Single-sequence figures run one sequence
//! alone in the pool's first pages; throughput runs the chapter's own serve loop.
//!
//! Two figures are chapter 10's own: the decode step at a long context with and without
//! flash-decoding (`decode_step_ms_long_split`, `decode_step_ms_long_whole`), and the mixed
//! workload in the chapter's default pool of [`SMALL_POOL_MIB`] MiB, where admission has
//! to wait for pages (`throughput_mixed_pool_128mib`).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use ch10_paged_attention::checkpoint::{self, Checkpoint};
use ch10_paged_attention::config::Config;
use ch10_paged_attention::generate;
use ch10_paged_attention::gpu::Gpu;
use ch10_paged_attention::kv_cache::{self, KvCache};
use ch10_paged_attention::model::Model;
use ch10_paged_attention::ops;
use ch10_paged_attention::page_pool::{PAGE_SIZE, pages_for};
use ch10_paged_attention::requests::Request;
use ch10_paged_attention::scheduler::{Admission, Demand, Policy, Scheduler, StepBatch};
use ch10_paged_attention::serve::{self, Summary};
use ch10_paged_attention::weights::Weights;
use cudarc::driver::CudaContext;

use crate::figures;
use crate::memory::MemoryWatch;
use crate::record::{Measurement, Part, repeat};
use crate::workload::{self, Batch, Workloads};

pub const SYSTEM: &str = "ch10-paged-attention";
/// Sequences one decode step may hold: the largest concurrency measured.
const MAX_BATCH: usize = 256;
/// Batch sizes of the step-time sweep (batch 1 is the single-sequence figure).
const SWEEP: [usize; 4] = [8, 32, 128, 256];
/// Decode steps timed per run of the sweep.
const SWEEP_STEPS: usize = 16;
/// Sequences the mixed workload is served in at most: fewer than its requests, so that the
/// policies differ (as in chapter 9).
const MIXED_BATCH: usize = 16;
/// Decode steps timed per run at a long context: the last ones before the context is full.
const LONG_STEPS: usize = 32;
/// How a decode step's attention covers a sequence's positions, with flash-decoding and without.
const SPLIT: &str = "flash-decoding: the positions split among blocks as Split::choose says (the chapter's default)";
const WHOLE: &str = "no flash-decoding: one block per sequence and KV head, as chapter 9 (--no-split-kv)";
/// The chapter's default pool (`--kv-cache-mib`), too small for the mixed workload at once.
const SMALL_POOL_MIB: usize = 128;
/// Decode steps a profile runs before the profiler starts.
const WARM_STEPS: usize = 16;

/// Pages of the benchmark's pool: enough that every request of the largest batch is admitted
/// at once (the sum of their page budgets, the most the scheduler can ever reserve for
/// them; no margin is needed), and at least one whole context for a sequence alone.
fn pool_pages(workloads: &Workloads, context: usize) -> usize {
    let budgets = |batch: &Batch| -> usize {
        batch.requests.iter().map(|r| Demand::new(r.prompt.len(), r.new_tokens).pages).sum()
    };
    workloads.batches.iter().map(budgets).max().unwrap_or(0).max(pages_for(context))
}

/// Loads the model `1 + runs` times (the first fills the page cache) and keeps the last.
fn load(
    ctx: &Arc<CudaContext>,
    model_dir: &Path,
    workloads: &Workloads,
    runs: usize,
) -> Result<(Model, Vec<f64>, Checkpoint)> {
    let mut config = Config::from_file(&model_dir.join("config.json"))?;
    ops::check_attention_shape(&config)?;
    ops::check_decode_shape(&config)?;
    let files = checkpoint::model_files(model_dir)?;
    let stream = ctx.default_stream();
    let mut seconds = Vec::new();
    let mut loaded = None;
    for run in 0..=runs {
        drop(loaded.take()); // the previous copy's GPU memory goes back first
        let start = Instant::now();
        let checkpoint = Checkpoint::open(&files, &config)?;
        let weights = Weights::upload(&stream, &checkpoint, &config)?;
        stream.synchronize()?;
        if run > 0 {
            seconds.push(start.elapsed().as_secs_f64());
        }
        loaded = Some((weights, checkpoint));
    }
    let (weights, checkpoint) = loaded.expect("at least one load ran");
    let context = generate::context_limit(&config, None)?;
    config.eos_token_id.clear(); // every request runs to its budget
    let gpu = Gpu::new(ctx, stream)?;
    let model = Model::new(gpu, weights, config, context, MAX_BATCH, pool_pages(workloads, context))?;
    Ok((model, seconds, checkpoint))
}

fn request(item: &workload::Request) -> Request {
    Request { prompt: item.prompt.clone(), max_new_tokens: item.new_tokens }
}

/// The pool row that `position` of a sequence with `block_table` goes to: offset
/// `position % PAGE_SIZE` of its page (what the scheduler's batches call cache rows).
fn cache_row(block_table: &[u32], position: usize) -> u32 {
    (block_table[position / PAGE_SIZE] as usize * PAGE_SIZE + position % PAGE_SIZE) as u32
}

/// One sequence alone in the pages of `block_table` (a whole context's): the seconds to its
/// first token and per later token.
fn run_alone(model: &mut Model, block_table: &[u32], item: &workload::Request) -> Result<(f64, f64)> {
    let start = Instant::now();
    model.forward(block_table, &item.prompt)?;
    let first = model.next_tokens()?[0];
    let first_token = start.elapsed().as_secs_f64();
    let mut batch = StepBatch::single(first, item.prompt.len(), block_table, model.batch.table_width);
    let decode_start = Instant::now();
    for step in 1..item.new_tokens {
        let position = item.prompt.len() + step - 1;
        batch.positions[0] = position as u32;
        batch.cache_rows[0] = cache_row(block_table, position);
        model.decode(&batch)?;
        batch.ids[0] = model.next_tokens()?[0];
    }
    let steps = item.new_tokens.saturating_sub(1).max(1);
    Ok((first_token, decode_start.elapsed().as_secs_f64() / steps as f64))
}

/// `rows` sequences of `requests`' prompts (cycled), admitted by the chapter's scheduler
/// with page budgets for `steps` decode steps each, prefilled into their pages and started.
fn start_sequences(model: &mut Model, requests: &[workload::Request], rows: usize, steps: usize) -> Result<Scheduler> {
    let prompts: Vec<&[u32]> = requests.iter().cycle().take(rows).map(|r| r.prompt.as_slice()).collect();
    // The first token comes from the prefill; each decode step caches one more position.
    let demands = prompts.iter().map(|p| Demand::new(p.len(), steps + 1)).collect();
    let mut scheduler = Scheduler::new(Policy::Continuous, Admission::Conservative, rows, model.cache.pages, demands);
    let admitted = scheduler.admit();
    ensure!(
        admitted.len() == rows,
        "the pool of {} pages holds {} of {rows} sequences",
        model.cache.pages,
        admitted.len()
    );
    for (request, slot) in admitted {
        model.forward(&scheduler.running(slot).expect("admitted").block_table, prompts[request])?;
        let first = model.next_tokens()?[0];
        scheduler.start(slot, prompts[request].len(), first);
    }
    Ok(scheduler)
}

/// One decode step of every started sequence, as serving runs it: the scheduler packs the
/// batch (a sequence crossing into a new page takes it), the model decodes it, and each
/// sequence advances by the token it chose.
fn decode_step(model: &mut Model, scheduler: &mut Scheduler, batch: &mut StepBatch) -> Result<()> {
    scheduler.step_batch(batch);
    model.decode(batch)?;
    for (&slot, &token) in batch.slots.iter().zip(model.next_tokens()?) {
        scheduler.advance(slot as usize, token);
    }
    Ok(())
}

/// Serves `requests` once and checks that each generated its budget (none rejected, none
/// stopped early); returns generated tokens per second, prefill included, and the summary.
fn serve_once(model: &mut Model, requests: &[Request], policy: Policy, max_batch: usize) -> Result<(f64, Summary)> {
    let tokens: usize = requests.iter().map(|r| r.max_new_tokens).sum();
    let summary = serve::serve(model, requests, policy, Admission::Conservative, max_batch, &[], |_| Ok(()))?;
    ensure!(
        summary.generated_tokens == tokens,
        "served {} tokens, expected {tokens} ({} requests rejected)",
        summary.generated_tokens,
        summary.rejected.len()
    );
    Ok((tokens as f64 / summary.seconds, summary))
}

pub fn measure(
    ctx: &Arc<CudaContext>,
    model_dir: &Path,
    workloads: &Workloads,
    runs: usize,
    part: &mut Part,
) -> Result<()> {
    let mut memory = MemoryWatch::new(ctx)?;
    let (mut model, seconds, checkpoint) = load(ctx, model_dir, workloads, runs)?;
    memory.sample()?;
    let tensors: Vec<(&str, usize)> = checkpoint.tensors.iter().map(|t| (t.name.as_str(), t.bytes.len())).collect();
    let config = &model.config;
    let q_width = config.num_attention_heads * config.head_dim;
    crate::facts::describe_model(&tensors, config.tie_word_embeddings, config.num_hidden_layers, q_width, part);
    figures::load(seconds, &tensors, part);
    part.note("context", model.context);
    part.note("slots", MAX_BATCH);
    part.note("pool_pages", model.cache.pages);

    // A sequence alone holds the pool's first pages, a whole context of them.
    let alone: Vec<u32> = (0..pages_for(model.context) as u32).collect();
    figures::single_sequence(workloads, runs, part, |item| run_alone(&mut model, &alone, item))?;
    flash_decoding(&mut model, &alone, workloads, runs, part)?;
    step_sweep(&mut model, workloads, runs, part)?;
    memory.sample()?;
    throughput(&mut model, workloads, runs, part)?;
    memory.sample()?;
    let cache = model.cache.bytes();
    part.note("kv_cache_bytes", cache);
    let detail = format!(
        "device memory taken from the start of the run, the KV cache's pool of {} pages ({:.0} MiB) included",
        model.cache.pages,
        cache as f64 / 1048576.0
    );
    part.push(memory.peak_figure(&detail));
    // Last, since it gives the large pool up for good.
    small_pool(&mut model, workloads, runs, part)
}

/// What splitting a sequence's positions among blocks gains: the batch-1 decode step over
/// the last [`LONG_STEPS`] positions of a full context (the prefill workload's prompt,
/// shortened to leave room for them), with flash-decoding and without; and, without it, at
/// the single workload's short context, where there is little to split.
fn flash_decoding(model: &mut Model, alone: &[u32], workloads: &Workloads, runs: usize, part: &mut Part) -> Result<()> {
    let prompt_tokens = model.context.saturating_sub(LONG_STEPS).min(workloads.prefill.prompt.len());
    let long =
        workload::Request { prompt: workloads.prefill.prompt[..prompt_tokens].to_vec(), new_tokens: LONG_STEPS + 1 };
    let positions = format!(
        "prompt {prompt_tokens}, then {LONG_STEPS} decode steps at positions {prompt_tokens}..={}; host clock, each \
         step waits for its token",
        prompt_tokens + LONG_STEPS - 1
    );
    let split = step_ms(model, alone, &long, runs, true)?;
    part.push(Measurement::of_runs("decode_step_ms_long_split", "ms", split, &format!("{positions}; {SPLIT}")));
    let whole = step_ms(model, alone, &long, runs, false)?;
    part.push(Measurement::of_runs("decode_step_ms_long_whole", "ms", whole, &format!("{positions}; {WHOLE}")));
    let whole = step_ms(model, alone, &workloads.single, runs, false)?;
    part.push(Measurement::of_runs("decode_step_ms_whole", "ms", whole, &format!("as decode_step_ms; {WHOLE}")));
    Ok(())
}

/// The decode step of `item` alone, in ms, over `runs` runs after a warm-up, with
/// flash-decoding on or off; the model is left with it on, the chapter's default.
fn step_ms(model: &mut Model, alone: &[u32], item: &workload::Request, runs: usize, split: bool) -> Result<Vec<f64>> {
    model.split_kv = split;
    let times = repeat(runs, || Ok(run_alone(model, alone, item)?.1 * 1e3));
    model.split_kv = true;
    times
}

/// The step time as the batch grows: every row of the batch a sequence of about 130
/// positions, the step's tokens chosen and copied back as in serving.
fn step_sweep(model: &mut Model, workloads: &Workloads, runs: usize, part: &mut Part) -> Result<()> {
    let concurrent = &workloads.batches[0].requests;
    for rows in SWEEP {
        let mut scheduler = start_sequences(model, concurrent, rows, 1)?;
        let mut batch = StepBatch::with_capacity(rows, model.batch.table_width);
        scheduler.step_batch(&mut batch);
        let times = repeat(runs, || {
            let start = Instant::now();
            for _ in 0..SWEEP_STEPS {
                model.decode(&batch)?;
                let chosen = model.next_tokens()?;
                batch.ids.copy_from_slice(chosen);
            }
            Ok(start.elapsed().as_secs_f64() * 1e3 / SWEEP_STEPS as f64)
        })?;
        // The positions do not advance: each step rewrites the same pool rows, so every run
        // times the same step and no sequence needs another page.
        let what =
            format!("{rows} sequences of ~130 positions, one token each; host clock, each step waits for its tokens");
        part.push(Measurement::of_runs(&format!("decode_step_ms_batch_{rows}"), "ms", times, &what));
    }
    Ok(())
}

/// Every batch served by the chapter's loop in the large pool: continuous batching, and for
/// the mixed workload static batching too, in at most [`MIXED_BATCH`] sequences at once.
fn throughput(model: &mut Model, workloads: &Workloads, runs: usize, part: &mut Part) -> Result<()> {
    let pages = model.cache.pages;
    for batch in &workloads.batches {
        let requests: Vec<Request> = batch.requests.iter().map(request).collect();
        let (policies, max_batch): (&[(Policy, &str)], usize) = if batch.name == "mixed" {
            (&[(Policy::Continuous, ""), (Policy::Static, "_static")], MIXED_BATCH)
        } else {
            (&[(Policy::Continuous, "")], MAX_BATCH)
        };
        for &(policy, suffix) in policies {
            let rates = repeat(runs.min(3), || Ok(serve_once(model, &requests, policy, max_batch)?.0))?;
            let how = if policy == Policy::Static { "static" } else { "continuous" };
            let what = format!(
                "{} requests, {how} batching, at most {max_batch} at once in a pool of {pages} pages; generated \
                 tokens / wall time, prefill included",
                requests.len()
            );
            part.push(Measurement::of_runs(&format!("throughput_{}{suffix}", batch.name), "tokens/s", rates, &what));
        }
    }
    Ok(())
}

/// The mixed workload, continuous, in the chapter's default pool of [`SMALL_POOL_MIB`] MiB
/// with room in the batch for every request: the pool alone decides how many run at once,
/// and a request waits at the head of the queue until its page budget fits. Replaces the
/// model's pool with the small one.
fn small_pool(model: &mut Model, workloads: &Workloads, runs: usize, part: &mut Part) -> Result<()> {
    let pages = kv_cache::pages_in(SMALL_POOL_MIB, &model.config)?;
    model.cache = KvCache::new(&model.gpu, &model.config, pages)?;
    let mixed = workloads.batches.iter().find(|b| b.name == "mixed").context("the workloads hold no mixed batch")?;
    let requests: Vec<Request> = mixed.requests.iter().map(request).collect();
    let mut last = None;
    let rates = repeat(runs.min(3), || {
        let (rate, summary) = serve_once(model, &requests, Policy::Continuous, MAX_BATCH)?;
        last = Some(summary);
        Ok(rate)
    })?;
    // Without end tokens, every run admits and finishes the same requests at the same steps.
    let summary = last.expect("repeat serves at least once");
    part.note("small_pool_pages", pages);
    part.note("small_pool_peak_assigned_pages", summary.peak_assigned_pages);
    part.note("small_pool_admission_waits", summary.admission_waits);
    let what = format!(
        "{} requests, continuous batching, at most {MAX_BATCH} at once in a pool of {pages} pages ({SMALL_POOL_MIB} \
         MiB): peak {} pages assigned, {} admission waits, largest decode batch {}; generated tokens / wall time, \
         prefill included",
        requests.len(),
        summary.peak_assigned_pages,
        summary.admission_waits,
        summary.largest_batch
    );
    let figure = format!("throughput_mixed_pool_{SMALL_POOL_MIB}mib");
    part.push(Measurement::of_runs(&figure, "tokens/s", rates, &what));
    Ok(())
}

/// For a profiler: `rows` sequences, warm decode steps, then `steps` more between
/// cuProfilerStart and cuProfilerStop.
pub fn profile(
    ctx: &Arc<CudaContext>,
    model_dir: &Path,
    workloads: &Workloads,
    steps: usize,
    rows: usize,
) -> Result<()> {
    let (mut model, _, _checkpoint) = load(ctx, model_dir, workloads, 0)?;
    let mut scheduler = start_sequences(&mut model, &workloads.batches[0].requests, rows, WARM_STEPS + steps)?;
    let mut batch = StepBatch::with_capacity(rows, model.batch.table_width);
    for _ in 0..WARM_STEPS {
        decode_step(&mut model, &mut scheduler, &mut batch)?;
    }
    crate::profiler::start()?;
    for _ in 0..steps {
        decode_step(&mut model, &mut scheduler, &mut batch)?;
    }
    crate::profiler::stop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_admits_the_largest_batch_at_once() {
        // 256 requests of 128 + 128 tokens cache 255 positions each at most: 16 pages.
        assert_eq!(pool_pages(&Workloads::generate(1), 2048), 256 * 16);
    }

    #[test]
    fn a_position_goes_to_its_offset_in_its_page() {
        assert_eq!(cache_row(&[7, 3], 0), 7 * 16);
        assert_eq!(cache_row(&[7, 3], 17), 3 * 16 + 1);
    }
}
