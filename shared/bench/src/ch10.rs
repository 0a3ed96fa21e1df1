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
//!
//! Last, the trade between the two admission rules (`admission_*`): a workload whose
//! requests mostly stop at an end token long before their budgets, served with the
//! model's end tokens back, in two small pools. Conservative admission reserves every
//! request's whole budget, never preempts, and under-fills the pool; optimistic admission
//! fills it and pays with recomputation. Only the synthetic checkpoint makes requests stop
//! where the workload says, so with any other these figures are skipped, with a note.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use ch10_paged_attention::checkpoint::{self, Checkpoint};
use ch10_paged_attention::config::Config;
use ch10_paged_attention::generate::{self, Stop};
use ch10_paged_attention::gpu::Gpu;
use ch10_paged_attention::kv_cache::{self, KvCache};
use ch10_paged_attention::model::Model;
use ch10_paged_attention::ops;
use ch10_paged_attention::page_pool::{cache_row, pages_for};
use ch10_paged_attention::requests::Request;
use ch10_paged_attention::scheduler::{Admission, Demand, Policy, Scheduler, StepBatch};
use ch10_paged_attention::serve::{self, Summary};
use ch10_paged_attention::weights::Weights;
use cudarc::driver::CudaContext;
use half::bf16;
use llama_reference::synth::circuit::{BEGIN_OF_TEXT, END_AFTER, Layout};

use crate::figures;
use crate::memory::MemoryWatch;
use crate::record::{Measurement, Part, repeat};
use crate::workload::{self, Batch, Stopping, Workloads};

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
/// The pools of the admission figures, in MiB: 64 and 256 pages of Llama 3.2 1B. A request
/// of the early-stopping workload reserves up to 48 pages conservatively (256 + 511
/// positions), so the smaller pool runs one at a time under that rule; 8 MiB (16 pages)
/// could not hold a single one under either rule.
const ADMISSION_POOLS_MIB: [usize; 2] = [32, 128];
/// The admission rules compared, with the names their figures carry.
const ADMISSIONS: [(Admission, &str); 2] =
    [(Admission::Conservative, "conservative"), (Admission::Optimistic, "optimistic")];
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
    // Last, since they give the large pool up for good.
    small_pool(&mut model, workloads, runs, part)?;
    admission_trade(&mut model, &checkpoint, model_dir, workloads.seed, runs, part)
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

/// Conservative admission against optimistic on the early-stopping workload of `seed` (see
/// [`workload::early_stopping`]), continuous batching with room in the batch for every
/// request, in each pool of [`ADMISSION_POOLS_MIB`]. Requests must stop at their end tokens
/// here, so the model serves with config.json's (which `load` cleared); it is given back with
/// them cleared again and a pool of the size it had. Skipped, with a note, unless the
/// checkpoint is synthetic: only the planted rule makes the early requests stop early.
fn admission_trade(
    model: &mut Model,
    checkpoint: &Checkpoint,
    model_dir: &Path,
    seed: u64,
    runs: usize,
    part: &mut Part,
) -> Result<()> {
    if !is_synthetic(checkpoint, &model.config) {
        let why = "skipped: the checkpoint is not synthetic, and only the synthetic model's planted rule makes \
                   the early-stopping workload's requests stop where it says";
        println!("bench: {SYSTEM} admission figures {why}");
        part.note("admission_trade", why);
        return Ok(());
    }
    let workload = workload::early_stopping(seed);
    let requests: Vec<Request> = workload.iter().map(|s| request(&s.request)).collect();
    let end_tokens = Config::from_file(&model_dir.join("config.json"))?.eos_token_id;
    let cleared = std::mem::replace(&mut model.config.eos_token_id, end_tokens);
    let pages = model.cache.pages;
    let measured = admission_figures(model, &workload, &requests, runs, part);
    model.config.eos_token_id = cleared;
    model.cache = KvCache::new(&model.gpu, &model.config, pages)?;
    measured
}

/// Whether the checkpoint is synthetic (`cargo x synth`), whose greedy output follows the
/// planted rule. Its mark: `<|begin_of_text|>`'s embedding row is the attention sink, zero
/// in every coordinate but [`Layout::SINK`], which no trained model's row is.
fn is_synthetic(checkpoint: &Checkpoint, config: &Config) -> bool {
    let Some(embedding) = checkpoint.tensors.iter().find(|t| t.name == "model.embed_tokens.weight") else {
        return false;
    };
    let row = config.hidden_size * size_of::<bf16>();
    let start = BEGIN_OF_TEXT as usize * row;
    checkpoint.bytes(embedding).get(start..start + row).is_some_and(is_sink_row)
}

/// Whether a row of bf16 values is zero in every coordinate but [`Layout::SINK`].
fn is_sink_row(row: &[u8]) -> bool {
    let values = row.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32());
    values.enumerate().all(|(coordinate, value)| (value != 0.0) == (coordinate == Layout::SINK))
}

/// The premise check, then the figures of each rule in each pool of [`ADMISSION_POOLS_MIB`];
/// a pool too small for the largest request is skipped, with a note.
fn admission_figures(
    model: &mut Model,
    workload: &[Stopping],
    requests: &[Request],
    runs: usize,
    part: &mut Part,
) -> Result<()> {
    let tokens = check_premise(model, workload, requests)?;
    let early = workload.iter().filter(|s| s.stops_early).count();
    part.note(
        "admission_workload",
        format!(
            "{} requests of budget {}, prompts of {}-{} tokens: {early} stop early at an end token, {} run to \
             their budget; {tokens} generated tokens in all",
            requests.len(),
            workload::EARLY_STOPPING_NEW_TOKENS,
            workload::EARLY_STOPPING_PROMPT_TOKENS.0,
            workload::EARLY_STOPPING_PROMPT_TOKENS.1,
            requests.len() - early
        ),
    );
    // Either rule rejects a request whose whole budget is larger than the pool.
    let largest = requests.iter().map(|r| Demand::new(r.prompt.len(), r.max_new_tokens).pages).max().unwrap_or(0);
    for mib in ADMISSION_POOLS_MIB {
        let pages = kv_cache::pages_in(mib, &model.config)?;
        part.note(&format!("admission_pool_pages_{mib}mib"), pages);
        if pages < largest {
            // A larger model's pages are larger: 32 MiB holds 16 of Llama 3.1 8B's.
            let why = format!("skipped: {pages} pages, and the largest request's budget takes {largest}");
            println!("bench: {SYSTEM} admission figures at {mib} MiB {why}");
            part.note(&format!("admission_pool_{mib}mib"), why);
            continue;
        }
        model.cache = KvCache::new(&model.gpu, &model.config, pages)?;
        for (admission, name) in ADMISSIONS {
            serve_timed(model, requests, admission, tokens, runs, part, &format!("{name}_{mib}mib"))?;
        }
    }
    Ok(())
}

/// The figures of `admission` in the model's pool (`which`: the rule and the pool, as in
/// `admission_throughput_optimistic_32mib`), over `runs` runs (at most 3) after a warm-up.
fn serve_timed(
    model: &mut Model,
    requests: &[Request],
    admission: Admission,
    tokens: usize,
    runs: usize,
    part: &mut Part,
    which: &str,
) -> Result<()> {
    let mut summaries = Vec::new();
    let rates = repeat(runs.min(3), || {
        let summary = serve_admitted(model, requests, admission, tokens)?;
        let rate = tokens as f64 / summary.seconds;
        summaries.push(summary);
        Ok(rate)
    })?;
    // The first summary is the warm-up's.
    record_trade(part, which, admission, &summaries[1..], rates);
    Ok(())
}

/// Serves the workload once, conservatively (so nothing is preempted) in whatever pool the
/// model holds, and checks that the synthetic model follows its planted rule: every early
/// request ends at an end token within `END_AFTER + 1` tokens (the rule says after exactly
/// [`END_AFTER`]), every long one runs to its budget. A model that does not would make the
/// figures measure some other workload, so this fails the bench. Returns the tokens
/// generated, which every later run must match.
fn check_premise(model: &mut Model, workload: &[Stopping], requests: &[Request]) -> Result<usize> {
    let mut outcomes = vec![None; requests.len()];
    let summary = serve::serve(model, requests, Policy::Continuous, Admission::Conservative, MAX_BATCH, &[], |done| {
        outcomes[done.request] = Some((done.tokens.len(), done.stop));
        Ok(())
    })?;
    check_pool(&summary)?;
    for (index, (stopping, outcome)) in workload.iter().zip(outcomes).enumerate() {
        let (generated, stop) = outcome.with_context(|| format!("request {index} was served but never finished"))?;
        let budget = stopping.request.new_tokens;
        let (kind, held) = if stopping.stops_early {
            ("early", generated <= END_AFTER + 1 && matches!(stop, Stop::EndToken(_)))
        } else {
            ("long", generated == budget)
        };
        ensure!(
            held,
            "the synthetic model does not follow its planted rule: request {index} ({kind}, prompt of {} tokens) \
             generated {generated} tokens and stopped by {stop:?}, where an early request ends at an end token \
             within {} tokens and a long one runs to its budget of {budget}",
            stopping.request.prompt.len(),
            END_AFTER + 1
        );
    }
    Ok(summary.generated_tokens)
}

/// Serves `requests` under `admission`, continuous, at most [`MAX_BATCH`] at once, and checks
/// the run: the pool whole again, exactly `tokens` generated (the same requests, greedy: the
/// rule cannot change a token), and no preemption under the conservative rule.
fn serve_admitted(model: &mut Model, requests: &[Request], admission: Admission, tokens: usize) -> Result<Summary> {
    let summary = serve::serve(model, requests, Policy::Continuous, admission, MAX_BATCH, &[], |_| Ok(()))?;
    check_pool(&summary)?;
    ensure!(
        summary.generated_tokens == tokens,
        "{admission:?} admission generated {} tokens, the premise check {tokens}: the same requests, greedy, must \
         generate the same tokens",
        summary.generated_tokens
    );
    ensure!(
        admission == Admission::Optimistic || summary.preemptions == 0,
        "conservative admission preempted {} requests",
        summary.preemptions
    );
    Ok(summary)
}

/// That no request was rejected and every page came back.
fn check_pool(summary: &Summary) -> Result<()> {
    ensure!(
        summary.rejected.is_empty(),
        "{} requests rejected: their budgets are larger than the pool of {} pages",
        summary.rejected.len(),
        summary.pool_pages
    );
    ensure!(
        summary.free_pages == summary.pool_pages,
        "{} of the pool's {} pages did not come back",
        summary.pool_pages - summary.free_pages,
        summary.pool_pages
    );
    Ok(())
}

/// The figures of one rule in one pool (`which`, as in [`serve_timed`]): the rate, and
/// under the optimistic rule the preemptions and recomputed tokens of each timed run. The
/// rate's detail quotes the last run.
fn record_trade(part: &mut Part, which: &str, admission: Admission, timed: &[Summary], rates: Vec<f64>) {
    let last = timed.last().expect("repeat times at least one run");
    let what = format!(
        "{} early-stopping requests of budget {}, continuous batching, at most {MAX_BATCH} at once, {admission:?} \
         admission in a pool of {} pages: {} preemptions, {} recomputed tokens, peak {} active requests, {} \
         admission waits, peak {} pages assigned; generated tokens / wall time, prefill and recomputation included",
        last.requests,
        workload::EARLY_STOPPING_NEW_TOKENS,
        last.pool_pages,
        last.preemptions,
        last.recomputed_tokens,
        last.peak_active,
        last.admission_waits,
        last.peak_assigned_pages
    );
    part.push(Measurement::of_runs(&format!("admission_throughput_{which}"), "tokens/s", rates, &what));
    if admission == Admission::Optimistic {
        let each_run = |count: fn(&Summary) -> usize| timed.iter().map(|s| count(s) as f64).collect();
        let (preemptions, recomputed) = (each_run(|s| s.preemptions), each_run(|s| s.recomputed_tokens));
        let what = "requests preempted in a run (each resumed later by recomputing its prefix)";
        part.push(Measurement::of_runs(&format!("admission_preemptions_{which}"), "requests", preemptions, what));
        let what = "prefix tokens prefilled again to resume preempted requests, in a run";
        part.push(Measurement::of_runs(&format!("admission_recomputed_tokens_{which}"), "tokens", recomputed, what));
    }
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
    fn only_a_row_of_zeros_but_the_sink_marks_a_synthetic_checkpoint() {
        let row =
            |values: &[f32]| -> Vec<u8> { values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect() };
        let mut sink = vec![0.0; 64];
        sink[Layout::SINK] = 8.0;
        assert!(is_sink_row(&row(&sink)));
        sink[Layout::SINK + 1] = -0.01;
        assert!(!is_sink_row(&row(&sink)));
        assert!(!is_sink_row(&row(&[0.0; 64])));
        let trained: Vec<f32> = (0..64).map(|i| (i as f32 - 30.5) * 1e-3).collect();
        assert!(!is_sink_row(&row(&trained)));
    }
}
