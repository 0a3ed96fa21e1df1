//! Chapter 10: paged attention, the full engine.
//!
//! Many requests at once, their keys and values in pages of one shared pool: each request
//! is admitted when the pages it may need fit, its prompt is prefilled into its pages, and
//! every decode step runs one token of every running request together.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Parser;

use ch10_paged_attention::checkpoint::{self, Checkpoint};
use ch10_paged_attention::config::Config;
use ch10_paged_attention::generate::Stop;
use ch10_paged_attention::gpu::{self, Gpu};
use ch10_paged_attention::model::Model;
use ch10_paged_attention::page_pool::{PAGE_SIZE, pages_for};
use ch10_paged_attention::requests::{self, Request, RequestText};
use ch10_paged_attention::scheduler::{Admission, Policy};
use ch10_paged_attention::serve::Summary;
use ch10_paged_attention::serve::{self, Response};
use ch10_paged_attention::tokenizer::Tokenizer;
use ch10_paged_attention::tokenizer::commands::{self, Command, join_ids};
use ch10_paged_attention::weights::{self, Weights};
use ch10_paged_attention::{check, generate, kv_cache, ops, rope};

// ANCHOR: cli
#[derive(Parser)]
#[command(
    version,
    about = "Chapter 10: the full engine: many requests at once, their KV cache in pages of one shared pool, admitted by page budget (static or continuous batching)",
    subcommand_negates_reqs = true,
    override_usage = "ch10-paged-attention [OPTIONS] <PROMPT> [MAX_NEW_TOKENS] [PROMPT]...\n       ch10-paged-attention [OPTIONS] --prompts-file FILE\n       ch10-paged-attention [--model DIR] [--tokenizer PATH] <COMMAND>"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Model directory holding config.json and model.safetensors (or its shards and their
    /// index); `synthetic`: a synthetic Llama 3.2 1B checkpoint, written once into models/synthetic-1b/.
    #[arg(long, global = true, value_name = "DIR", default_value_os_t = checkpoint::default_model_dir())]
    model: PathBuf,
    /// Meta's tokenizer.model [default: in the model directory, then the repository's models/tokenizer.model].
    #[arg(long, global = true, env = "LLAMA_TOKENIZER", value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// Print each safetensors file's 8-byte header length and its raw JSON header, then stop.
    #[arg(long)]
    header: bool,
    /// Stop after validating the files (no GPU needed).
    #[arg(long)]
    no_gpu: bool,
    /// Compare the GPU's results with the file and the CPU reference, and the first and last
    /// requests' batched steps with each decoded alone; exit non-zero on a mismatch.
    #[arg(long, conflicts_with = "no_gpu")]
    check: bool,
    /// Also print the tensor table, the prompt's tokens and the RoPE frequency table.
    #[arg(long)]
    verbose: bool,
    /// A system prompt to put before each user's prompt (a prompts file's own `system` wins).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// The most positions a sequence may hold, prompt and generated tokens together: the
    /// width of its block table [default: 2048, or less when the model or the kernels allow less].
    #[arg(long, value_name = "N")]
    max_context: Option<usize>,
    /// Static batching: admit a group of requests, as many as fit, when none runs, and wait
    /// for all of it to finish.
    #[arg(long = "static", conflicts_with = "continuous")]
    static_batching: bool,
    /// Continuous batching (the default): admit the next request as soon as its pages fit.
    #[arg(long)]
    continuous: bool,
    /// What a request reserves when admitted: `conservative`, pages for its whole budget (it
    /// can always finish); `optimistic`, the pages of its prompt only (more run at once, and
    /// when the pool runs dry the latest admitted is preempted and later recomputed).
    #[arg(long, value_enum, default_value_t = AdmissionArg::Conservative)]
    admission: AdmissionArg,
    /// The KV cache: one pool of this many MiB, shared by every request, in pages of 16 positions.
    #[arg(long, value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    kv_cache_mib: u32,
    /// The most requests decoded together (the rows of a decode step); the pool decides how
    /// many fit.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1024))]
    max_batch: u32,
    /// After the summary, how the pool was used: its size, peak active requests, largest
    /// decode batch, peak assigned pages, admission waits, preemptions and recomputed tokens
    /// (optimistic admission), and the free pages at the end.
    #[arg(long)]
    stats: bool,
    /// Decode attention with one block per sequence and KV head, as chapter 9, never split
    /// across blocks (to measure what flash-decoding gains).
    #[arg(long)]
    no_split_kv: bool,
    /// Requests from a file, one JSON object per line: {"prompt": "...", "max_new_tokens": 64, "system": "..."}.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt", "more_prompts"])]
    prompts_file: Option<PathBuf>,
    /// Print only the summary, not each response.
    #[arg(long)]
    quiet: bool,
    /// Write which request held which slot over which decode steps to FILE, as JSON (`cargo x
    /// bench --timeline FILE` draws it).
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// The first user's prompt.
    #[arg(required_unless_present_any = ["header", "prompts_file"])]
    prompt: Option<String>,
    /// How many tokens to generate at most, for every request (with --prompts-file, for the
    /// lines that give no `max_new_tokens`: 128).
    #[arg(default_value_t = 128, allow_negative_numbers = true, value_parser = generate::parse_max_new_tokens)]
    max_new_tokens: usize,
    /// More prompts, each a request of its own.
    #[arg(value_name = "PROMPT")]
    more_prompts: Vec<String>,
}
// ANCHOR_END: cli

/// `--admission`'s values (the scheduler's `Admission` knows nothing of the command line).
#[derive(Clone, Copy, clap::ValueEnum)]
enum AdmissionArg {
    Conservative,
    Optimistic,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

// ANCHOR: run
fn run(cli: Cli) -> Result<()> {
    if let Some(command) = &cli.command {
        commands::refuse_ignored(
            command,
            &[
                ("PROMPT", cli.prompt.is_some()),
                ("--system", cli.system.is_some()),
                ("--header", cli.header),
                ("--no-gpu", cli.no_gpu),
                ("--check", cli.check),
                ("--verbose", cli.verbose),
            ],
        )?;
        let tokenizer = Tokenizer::from_file(commands::tokenizer_file(cli.tokenizer.as_deref(), &cli.model)?)?;
        return commands::run_command(&tokenizer, command);
    }
    // A bad prompts file is reported before anything is loaded.
    let texts = request_texts(&cli)?;
    let cli = Cli { model: checkpoint::resolve_model_dir(&cli.model)?, ..cli };
    let model_files = checkpoint::model_files(&cli.model)?;
    if cli.header {
        return checkpoint::print_header(&model_files);
    }
    let config = Config::from_file(&cli.model.join("config.json"))?;
    ops::check_attention_shape(&config)?;
    ops::check_decode_shape(&config)?;
    let pages = kv_cache::pages_in(cli.kv_cache_mib as usize, &config)?;
    let checkpoint = Checkpoint::open(&model_files, &config)?;
    println!("model   {}", cli.model.display());
    println!("config  {}", config.summary());
    println!("        {}", config.constants());
    println!("{}", checkpoint.describe());
    if !checkpoint.ignored.is_empty() {
        println!("note    ignoring tensors a Llama model does not use: {}", checkpoint.ignored.join(", "));
    }
    if cli.verbose {
        println!();
        checkpoint::print_table(&checkpoint, &config);
    }
    let tokenizer = Tokenizer::from_file(commands::tokenizer_file(cli.tokenizer.as_deref(), &cli.model)?)?;
    let context = generate::context_limit(&config, cli.max_context)?;
    let requests = encode_requests(&tokenizer, &texts, &cli, context)?;
    let policy = if cli.static_batching { Policy::Static } else { Policy::Continuous };
    let slots = cli.max_batch as usize;
    let prompt_tokens: usize = requests.iter().map(|r| r.prompt.len()).sum();
    println!(
        "requests {} in the chat format, {prompt_tokens} prompt tokens; {} batching, up to {slots} at once",
        requests.len(),
        if policy == Policy::Static { "static" } else { "continuous" }
    );
    if cli.no_gpu {
        return show_requests(&tokenizer, &texts, &requests, &cli, &config.eos_token_id);
    }

    let ctx = gpu::open_gpu()?;
    let stream = ctx.default_stream();
    println!();
    println!("GPU     {}", gpu::describe(&ctx)?);
    let start = Instant::now();
    let weights = Weights::upload(&stream, &checkpoint, &config)?;
    let seconds = start.elapsed().as_secs_f64();
    let bytes: usize = checkpoint.tensors.iter().map(|t| t.bytes.len()).sum();
    println!(
        "upload  {:.2} GB in {:.3} s: {:.2} GB/s (allocate and copy, file to GPU through the page cache)",
        bytes as f64 / 1e9,
        seconds,
        bytes as f64 / 1e9 / seconds
    );
    if cli.check {
        weights::check_upload(&stream, &checkpoint, &weights)?;
    }
    if cli.verbose {
        show_requests(&tokenizer, &texts, &requests, &cli, &config.eos_token_id)?;
    }

    // ANCHOR: gpu_work
    let start = Instant::now();
    let mut gpu = Gpu::new(&ctx, stream.clone())?;
    gpu.poison_outputs = cli.check;
    println!("kernels compiled by NVRTC for {} in {:.0} ms", gpu.arch, start.elapsed().as_secs_f64() * 1e3);
    if cli.verbose {
        rope::print_frequency_table(&config);
    }
    // One pool of pages for every request, and the buffers, allocated once.
    let (free, _) = ctx.mem_get_info()?;
    let page_bytes = kv_cache::bytes_per_page(&config);
    if pages * page_bytes > free {
        bail!(
            "a KV cache of {} MiB does not fit: the GPU has {} MiB free (lower --kv-cache-mib)",
            cli.kv_cache_mib,
            free / (1024 * 1024)
        );
    }
    let mut model = Model::new(gpu, weights, config, context, slots, pages)?;
    model.split_kv = !cli.no_split_kv;
    println!(
        "cache   one pool of {pages} pages of {PAGE_SIZE} positions: {:.1} MiB of GPU memory, {} KiB per page ({} KiB per token)",
        model.cache.bytes() as f64 / (1024.0 * 1024.0),
        page_bytes / 1024,
        kv_cache::bytes_per_token(&model.config) / 1024
    );
    println!(
        "        {} positions in all: {} sequences of the full {context}-position context, or more shorter ones",
        pages * PAGE_SIZE,
        pages / pages_for(context)
    );
    println!();

    // --check samples the first request and the last, which runs beside others' ends.
    let sampled: Vec<usize> = if cli.check { vec![0, requests.len() - 1] } else { Vec::new() };
    let mut kept: Vec<Response> = Vec::new();
    let admission = match cli.admission {
        AdmissionArg::Conservative => Admission::Conservative,
        AdmissionArg::Optimistic => Admission::Optimistic,
    };
    let summary = serve::serve(&mut model, &requests, policy, admission, slots, &sampled, |response| {
        if !cli.quiet {
            print_response(&tokenizer, &response)?;
        }
        if sampled.contains(&response.request) {
            kept.push(response);
        }
        Ok(())
    })?;
    summary.print(slots);
    if cli.stats {
        summary.print_stats(page_bytes);
    }
    if let Some(file) = &cli.timeline {
        write_timeline(file, policy, slots, &summary)?;
    }
    if cli.check {
        kept.sort_by_key(|r| r.request);
        let checked: Vec<(&[u32], &Response)> =
            kept.iter().map(|r| (requests[r.request].prompt.as_slice(), r)).collect();
        check::check_against_reference(&mut model, &cli.model, &checked)?;
    }
    report_rejected(&summary, &requests, cli.kv_cache_mib)
    // ANCHOR_END: gpu_work
}

// ANCHOR: report_rejected
/// The requests that could never fit, one line each, and an error if there were any: the
/// others have run by now.
fn report_rejected(summary: &Summary, requests: &[Request], kv_cache_mib: u32) -> Result<()> {
    for rejected in &summary.rejected {
        let request = &requests[rejected.request];
        eprintln!(
            "error: request {} rejected: its prompt of {} tokens and budget of {} need {} pages of {PAGE_SIZE} positions, but the whole pool (--kv-cache-mib {kv_cache_mib}) holds {}",
            rejected.request,
            request.prompt.len(),
            request.max_new_tokens,
            rejected.pages,
            summary.pool_pages
        );
    }
    if !summary.rejected.is_empty() {
        bail!(
            "{} of {} requests rejected as larger than the KV cache (raise --kv-cache-mib, or lower their budgets)",
            summary.rejected.len(),
            requests.len()
        );
    }
    Ok(())
}
// ANCHOR_END: report_rejected

// ANCHOR: request_texts
/// The requests as the user gave them: the prompts on the command line, each with the
/// command line's budget, or the lines of `--prompts-file`.
fn request_texts(cli: &Cli) -> Result<Vec<RequestText>> {
    if let Some(file) = &cli.prompts_file {
        return requests::read_prompts_file(file);
    }
    let prompts = cli.prompt.iter().chain(&cli.more_prompts);
    prompts
        .map(|prompt| {
            commands::require_prompt(prompt)?;
            Ok(RequestText { prompt: prompt.clone(), max_new_tokens: None, system: None })
        })
        .collect()
}

/// Each request in the chat format, its budget settled; a prompt longer than the context
/// is refused, naming the request.
fn encode_requests(tokenizer: &Tokenizer, texts: &[RequestText], cli: &Cli, context: usize) -> Result<Vec<Request>> {
    let mut requests = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        let system = text.system.as_deref().or(cli.system.as_deref());
        let prompt = tokenizer.encode_prompt(system, &text.prompt)?;
        if prompt.len() > context {
            bail!("request {i}: the prompt is {} tokens in the chat format; the context holds {context}", prompt.len());
        }
        let max_new_tokens = text.max_new_tokens.unwrap_or(cli.max_new_tokens);
        let room = generate::room_after(prompt.len(), context);
        if max_new_tokens > room {
            println!(
                "note    request {i}: MAX_NEW_TOKENS {max_new_tokens} will be capped at {room}, {} fewer: a context of {context} tokens after a prompt of {}",
                max_new_tokens - room,
                prompt.len()
            );
        }
        requests.push(Request { prompt, max_new_tokens });
    }
    Ok(requests)
}
// ANCHOR_END: request_texts

/// Each request's prompt, token by token, as chapter 8 shows its one (`--no-gpu`, `--verbose`).
fn show_requests(
    tokenizer: &Tokenizer,
    texts: &[RequestText],
    requests: &[Request],
    cli: &Cli,
    end_tokens: &[u32],
) -> Result<()> {
    for (i, (text, request)) in texts.iter().zip(requests).enumerate() {
        println!();
        println!(
            "request {i}: {} prompt tokens, up to {} new: {:?}",
            request.prompt.len(),
            request.max_new_tokens,
            text.prompt
        );
        let system = text.system.as_deref().or(cli.system.as_deref());
        commands::show_prompt(tokenizer, system, &text.prompt, end_tokens)?;
    }
    Ok(())
}

/// The run's slot occupancy as JSON: the policy, the slots, the steps, and each request's stay.
fn write_timeline(file: &std::path::Path, policy: Policy, slots: usize, summary: &serve::Summary) -> Result<()> {
    let policy = if policy == Policy::Static { "static" } else { "continuous" };
    let json = serde_json::json!({
        "policy": policy,
        "slots": slots,
        "steps": summary.decode_steps,
        "occupancy": summary.timeline,
    });
    std::fs::write(file, serde_json::to_string_pretty(&json)? + "\n")
        .map_err(|e| anyhow::anyhow!("cannot write the timeline {}: {e}", file.display()))?;
    println!("timeline written to {}", file.display());
    Ok(())
}

/// One finished request: how it ended, its text, its ids.
fn print_response(tokenizer: &Tokenizer, response: &Response) -> Result<()> {
    let reason = match response.stop {
        Stop::EndToken(id) => format!("stop token {id}"),
        Stop::Budget => "token budget reached".to_string(),
        Stop::Context => "context full".to_string(),
    };
    let text_ids = match response.stop {
        Stop::EndToken(_) => &response.tokens[..response.tokens.len() - 1],
        _ => &response.tokens[..],
    };
    println!(
        "request {} (slot {}): {} tokens, first after {:.1} ms; stopped: {reason}",
        response.request,
        response.slot,
        response.tokens.len(),
        response.first_token_seconds * 1e3
    );
    println!("{}", tokenizer.decode(text_ids)?);
    println!("request {} ids: {}", response.request, join_ids(&response.tokens));
    println!();
    Ok(())
}
// ANCHOR_END: run
