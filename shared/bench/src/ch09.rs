//! Chapter 9 under the benchmark: many sequences at once, through the chapter's library.
//!
//! The model gets [`SLOTS`] slots, enough for the largest concurrency, and its end tokens
//! are cleared, so that every request generates exactly its budget (the bench's rule).
//! Single-sequence figures run one sequence in slot 0, as a batch of one; throughput runs
//! the chapter's own serve loop, continuous batching unless said otherwise.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use ch09_batching::checkpoint::{self, Checkpoint};
use ch09_batching::config::Config;
use ch09_batching::generate;
use ch09_batching::gpu::Gpu;
use ch09_batching::model::Model;
use ch09_batching::ops;
use ch09_batching::requests::Request;
use ch09_batching::scheduler::{Policy, StepBatch};
use ch09_batching::serve;
use ch09_batching::weights::Weights;
use cudarc::driver::CudaContext;

use crate::figures;
use crate::memory::MemoryWatch;
use crate::record::{Measurement, Part, repeat};
use crate::workload::{self, Workloads};

pub const SYSTEM: &str = "ch09-batching";
/// Slots of the benchmark's model: the largest concurrency measured.
const SLOTS: usize = 256;
/// Batch sizes of the step-time sweep (batch 1 is the single-sequence figure).
const SWEEP: [usize; 4] = [8, 32, 128, 256];
/// Decode steps timed per run of the sweep.
const SWEEP_STEPS: usize = 16;
/// Slots the mixed workload is served in: fewer than its requests, so that the policies differ.
const MIXED_SLOTS: usize = 16;

/// Loads the model `1 + runs` times (the first fills the page cache) and keeps the last.
fn load(ctx: &Arc<CudaContext>, model_dir: &Path, runs: usize) -> Result<(Model, Vec<f64>, Checkpoint)> {
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
    let model = Model::new(gpu, weights, config, context, SLOTS)?;
    Ok((model, seconds, checkpoint))
}

fn request(item: &workload::Request) -> Request {
    Request { prompt: item.prompt.clone(), max_new_tokens: item.new_tokens }
}

/// One sequence alone in slot 0: the seconds to its first token and per later token.
fn run_alone(model: &mut Model, item: &workload::Request) -> Result<(f64, f64)> {
    let start = Instant::now();
    model.forward(0, &item.prompt)?;
    let mut batch = StepBatch { slots: vec![0], ids: vec![model.next_tokens()?[0]], positions: vec![0] };
    let first_token = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    for step in 1..item.new_tokens {
        batch.positions[0] = (item.prompt.len() + step - 1) as u32;
        model.decode(&batch)?;
        batch.ids[0] = model.next_tokens()?[0];
    }
    let steps = item.new_tokens.saturating_sub(1).max(1);
    Ok((first_token, decode_start.elapsed().as_secs_f64() / steps as f64))
}

/// Fills slots `0..rows` with the prompts of `requests` and returns the batch of their
/// first decode step.
fn fill_slots(model: &mut Model, requests: &[workload::Request], rows: usize) -> Result<StepBatch> {
    let mut batch = StepBatch::with_capacity(rows);
    for (slot, item) in requests.iter().cycle().take(rows).enumerate() {
        model.forward(slot, &item.prompt)?;
        batch.slots.push(slot as u32);
        batch.ids.push(model.next_tokens()?[0]);
        batch.positions.push(item.prompt.len() as u32);
    }
    Ok(batch)
}

pub fn measure(
    ctx: &Arc<CudaContext>,
    model_dir: &Path,
    workloads: &Workloads,
    runs: usize,
    part: &mut Part,
) -> Result<()> {
    let mut memory = MemoryWatch::new(ctx)?;
    let (mut model, seconds, checkpoint) = load(ctx, model_dir, runs)?;
    memory.sample()?;
    let tensors: Vec<(&str, usize)> = checkpoint.tensors.iter().map(|t| (t.name.as_str(), t.bytes.len())).collect();
    let config = &model.config;
    let q_width = config.num_attention_heads * config.head_dim;
    crate::facts::describe_model(&tensors, config.tie_word_embeddings, config.num_hidden_layers, q_width, part);
    figures::load(seconds, &tensors, part);
    part.note("context", model.cache.capacity);
    part.note("slots", SLOTS);

    figures::single_sequence(workloads, runs, part, |item| run_alone(&mut model, item))?;

    // The step time as the batch grows: every slot of the batch full, its sequences at
    // about 130 positions, the step's token chosen and copied back as in serving.
    let concurrent = &workloads.batches[0].requests;
    for rows in SWEEP {
        let mut batch = fill_slots(&mut model, concurrent, rows)?;
        let times = repeat(runs, || {
            let start = Instant::now();
            for _ in 0..SWEEP_STEPS {
                model.decode(&batch)?;
                let chosen = model.next_tokens()?;
                batch.ids.copy_from_slice(chosen);
            }
            Ok(start.elapsed().as_secs_f64() * 1e3 / SWEEP_STEPS as f64)
        })?;
        // The positions do not advance: each step rewrites the same rows, so every run
        // times the same step and the cache never grows.
        let what =
            format!("{rows} sequences of ~130 positions, one token each; host clock, each step waits for its tokens");
        part.push(Measurement::of_runs(&format!("decode_step_ms_batch_{rows}"), "ms", times, &what));
    }
    memory.sample()?;

    for batch in &workloads.batches {
        let requests: Vec<Request> = batch.requests.iter().map(request).collect();
        let tokens: usize = requests.iter().map(|r| r.max_new_tokens).sum();
        let (policies, slots): (&[(Policy, &str)], usize) = if batch.name == "mixed" {
            (&[(Policy::Continuous, ""), (Policy::Static, "_static")], MIXED_SLOTS)
        } else {
            (&[(Policy::Continuous, "")], SLOTS)
        };
        for &(policy, suffix) in policies {
            let rates = repeat(runs.min(3), || {
                let summary = serve::serve(&mut model, &requests, policy, slots, &[], |_| Ok(()))?;
                anyhow::ensure!(
                    summary.generated_tokens == tokens,
                    "served {} tokens, expected {tokens}",
                    summary.generated_tokens
                );
                Ok(tokens as f64 / summary.seconds)
            })?;
            let how = if policy == Policy::Static { "static" } else { "continuous" };
            let what = format!(
                "{} requests, {how} batching in {slots} slots; generated tokens / wall time, prefill included",
                requests.len()
            );
            part.push(Measurement::of_runs(&format!("throughput_{}{suffix}", batch.name), "tokens/s", rates, &what));
        }
    }
    memory.sample()?;
    let cache = model.cache.bytes();
    part.note("kv_cache_bytes", cache);
    let detail = format!(
        "device memory taken from the start of the run, the KV cache of {SLOTS} slots ({:.0} MiB) included",
        cache as f64 / 1048576.0
    );
    part.push(memory.peak_figure(&detail));
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
    let (mut model, _, _checkpoint) = load(ctx, model_dir, 0)?;
    let mut batch = fill_slots(&mut model, &workloads.batches[0].requests, rows)?;
    let step = |model: &mut Model, batch: &mut StepBatch| -> Result<()> {
        model.decode(batch)?;
        let chosen = model.next_tokens()?;
        batch.ids.copy_from_slice(chosen);
        batch.positions.iter_mut().for_each(|p| *p += 1);
        Ok(())
    };
    for _ in 0..16 {
        step(&mut model, &mut batch)?;
    }
    crate::profiler::start()?;
    for _ in 0..steps {
        step(&mut model, &mut batch)?;
    }
    crate::profiler::stop()
}
