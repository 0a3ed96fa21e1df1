//! Chapter 8 under the benchmark: one sequence at a time, through the chapter's library.
//!
//! Each measurement drives the model the way `ch08-kv-cache` does (prefill, then one decode
//! step per token, each choosing its token on the GPU and copying it back), except that
//! end tokens do not stop it: every run generates exactly its budget.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use ch08_kv_cache::checkpoint::{self, Checkpoint};
use ch08_kv_cache::config::Config;
use ch08_kv_cache::generate;
use ch08_kv_cache::gpu::Gpu;
use ch08_kv_cache::model::Model;
use ch08_kv_cache::ops;
use ch08_kv_cache::weights::Weights;
use cudarc::driver::CudaContext;

use crate::figures;
use crate::memory::MemoryWatch;
use crate::record::{Measurement, Part, repeat};
use crate::workload::{Request, Workloads};

pub const SYSTEM: &str = "ch08-kv-cache";

/// Loads the model `1 + runs` times (the first fills the page cache) and keeps the last;
/// returns it with the seconds of each timed load and the bytes of tensors loaded.
fn load(ctx: &Arc<CudaContext>, model_dir: &Path, runs: usize) -> Result<(Model, Vec<f64>, Checkpoint)> {
    let config = Config::from_file(&model_dir.join("config.json"))?;
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
    let gpu = Gpu::new(ctx, stream)?;
    let model = Model::new(gpu, weights, config, context)?;
    Ok((model, seconds, checkpoint))
}

/// Prefill, then decode steps until `request` has its budget; returns the seconds to the
/// first token and those of each later token on average.
fn run_request(model: &mut Model, request: &Request) -> Result<(f64, f64)> {
    let start = Instant::now();
    model.forward(&request.prompt)?;
    let mut next = model.next_token()?;
    let first_token = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    for _ in 1..request.new_tokens {
        model.decode(next)?;
        next = model.next_token()?;
    }
    let steps = request.new_tokens.saturating_sub(1).max(1);
    Ok((first_token, decode_start.elapsed().as_secs_f64() / steps as f64))
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

    figures::single_sequence(workloads, runs, part, |request| run_request(&mut model, request))?;
    memory.sample()?;

    // One sequence at a time: N requests take N times as long as one. Measured at the
    // smallest concurrency only, where it costs seconds rather than minutes.
    let batch = &workloads.batches[0];
    let tokens: usize = batch.requests.iter().map(|r| r.new_tokens).sum();
    let rates = repeat(runs.min(3), || {
        let start = Instant::now();
        for request in &batch.requests {
            run_request(&mut model, request)?;
        }
        Ok(tokens as f64 / start.elapsed().as_secs_f64())
    })?;
    let what = format!("{} requests served one after another; generated tokens / wall time", batch.requests.len());
    part.push(Measurement::of_runs(&format!("throughput_{}", batch.name), "tokens/s", rates, &what));
    memory.sample()?;
    let cache = model.cache.bytes();
    part.note("kv_cache_bytes", cache);
    let detail =
        format!("device memory taken from the start of the run, KV cache {:.0} MiB included", cache as f64 / 1048576.0);
    part.push(memory.peak_figure(&detail));
    Ok(())
}

/// For a profiler: warm decode steps, then `steps` more between cuProfilerStart and
/// cuProfilerStop, so that `ncu --profile-from-start off` sees exactly those.
pub fn profile(ctx: &Arc<CudaContext>, model_dir: &Path, workloads: &Workloads, steps: usize) -> Result<()> {
    let (mut model, _, _checkpoint) = load(ctx, model_dir, 0)?;
    let single = &workloads.single;
    model.forward(&single.prompt)?;
    let mut next = model.next_token()?;
    for _ in 0..16 {
        model.decode(next)?;
        next = model.next_token()?;
    }
    crate::profiler::start()?;
    for _ in 0..steps {
        model.decode(next)?;
        next = model.next_token()?;
    }
    crate::profiler::stop()
}
