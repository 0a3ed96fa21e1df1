//! `cargo x gpu-check`: every chapter's `--check` on a synthetic Llama 3.2 1B checkpoint,
//! summarised in one table. Run it on a machine with an NVIDIA GPU.
//!
//! Each chapter binary prints its verdicts as lines of the form
//! `check: WHAT: MEASURED (limit LIMIT): PASS` and exits non-zero
//! when any of them fails.
//!
//! With `--sanitize` (after the normal checks) or `--sanitize-only` (instead of them), NVIDIA's
//! compute-sanitizer (found on `PATH`, else in `$CUDA_HOME/bin`, else `/usr/local/cuda/bin`)
//! runs each chosen chapter's `--check` once per tool, one after another, each run one row of
//! the same table: `memcheck --leak-check full` on the same checkpoint as the normal checks,
//! and `racecheck`, `initcheck` and `synccheck`, too slow at 1B, on a tiny synthetic checkpoint
//! written into `--sanitize-dir`; the chapters that generate make 4 new tokens. A row passes
//! when the sanitizer's last word, `ERROR SUMMARY: N errors` (racecheck's `RACECHECK SUMMARY:
//! … (N errors, W warnings)`), says N = 0 and the program itself succeeded; a missing summary
//! fails, and a program that failed under the sanitizer fails as such, not as a sanitizer
//! error. The chapters' own verdicts inside these runs are not rows: the normal checks cover
//! them. Each run's start and end are printed with its wall time, its whole output goes to a
//! log in `--sanitize-dir`, and the first lines a failing run reported are printed after it
//! and again after the table. `--sanitize-tool` narrows the tools and `--only` the chapters;
//! `--no-leak-check` and `--sanitizer-option` adjust the sanitizer's command line.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use llama_reference::synth::{SynthConfig, SynthOptions, write_checkpoint, write_checkpoint_with};

use crate::paths;

#[derive(clap::Args)]
pub struct Args {
    /// Folder holding the chapter binaries (ch01-weights, …) [default: target/release in the repository].
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// Use this model directory instead of writing a synthetic checkpoint.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The synthetic checkpoint's shape: `1b`, `3b` or `8b` (Llama 3.2 1B, 3.2 3B, 3.1 8B).
    #[arg(long, default_value = "1b", value_name = "1b|3b|8b")]
    config: String,
    /// Layers of the checkpoint the chapters' --check runs use; the CPU reference they compare
    /// with holds 4 bytes per parameter [default: all for 1b, 4 for 3b and 8b]. The agreement
    /// with transformers always runs at full depth.
    #[arg(long, value_name = "N")]
    check_layers: Option<usize>,
    /// Where to write the synthetic checkpoints: this path with `-1b` appended (or `-3b`,
    /// `-3b-4-layers`, … for the other shapes).
    #[arg(long, default_value = "/tmp/gpu-check")]
    work_dir: PathBuf,
    /// Seed of the synthetic weights; each run draws a new one unless given.
    #[arg(long)]
    seed: Option<u64>,
    /// Meta's tokenizer.model, for chapters 2 and later [default: they look for it themselves].
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Check only these chapters (e.g. `--only 07`; repeatable) [default: all].
    #[arg(long, value_name = "NN")]
    only: Vec<String>,
    /// Leave out the greedy tokens' agreement with transformers' generate().
    #[arg(long)]
    no_agreement: bool,
    /// Leave out the comparison with transformers' own bf16 drift on the fixed set of models.
    #[arg(long)]
    no_drift: bool,
    /// Where to write the fixed set's models, one at a time (2.5 GB each).
    #[arg(long, default_value = "/tmp/gpu-check-drift")]
    drift_dir: PathBuf,
    /// After the normal checks, run each chapter's --check under compute-sanitizer too
    /// (memcheck on the 1B checkpoint; racecheck, initcheck and synccheck on a tiny one).
    #[arg(long)]
    sanitize: bool,
    /// Only the compute-sanitizer runs of --sanitize, without the normal checks.
    #[arg(long, conflicts_with = "sanitize")]
    sanitize_only: bool,
    /// Run only these compute-sanitizer tools (repeatable) [default: all four].
    #[arg(long, value_enum, value_name = "TOOL")]
    sanitize_tool: Vec<Tool>,
    /// Where to write the tiny checkpoint and one log per compute-sanitizer run.
    #[arg(long, default_value = "/tmp/gpu-check-sanitize")]
    sanitize_dir: PathBuf,
    /// Leave out memcheck's `--leak-check full`.
    #[arg(long)]
    no_leak_check: bool,
    /// Give compute-sanitizer this option too, before the program, with every tool (repeatable:
    /// `--sanitizer-option=--report-api-errors --sanitizer-option=no`).
    #[arg(long, value_name = "OPTION", allow_hyphen_values = true)]
    sanitizer_option: Vec<String>,
}

/// One line of the final table: a chapter's `check:` line, or a note of ours.
struct Row {
    chapter: String,
    what: String,
    measured: String,
    limit: String,
    verdict: String,
}

pub fn run(args: Args) -> Result<()> {
    // Without a driver every chapter would fail the same way, after 2.5 GB of checkpoint.
    // SAFETY: only tries to load libcuda; nothing is called through it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        bail!("no NVIDIA driver found (libcuda.so cannot be loaded): gpu-check needs a machine with an NVIDIA GPU");
    }
    let sanitizing = args.sanitize || args.sanitize_only;
    if !args.sanitize_tool.is_empty() && !sanitizing {
        bail!("--sanitize-tool chooses the tools of --sanitize or --sanitize-only; give one of them");
    }
    let tools: Vec<Tool> = if args.sanitize_tool.is_empty() { Tool::ALL.to_vec() } else { args.sanitize_tool.clone() };
    // Found before anything is written, so that a machine without it fails at once.
    let sanitizer = if sanitizing { Some(find_sanitizer()?) } else { None };
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => paths::root()?.join("target/release"),
    };
    let seed = args.seed.unwrap_or_else(time_seed);
    let needs_model = !args.sanitize_only || tools.iter().any(|tool| !tool.on_tiny());
    let shape = SynthConfig::parse(&args.config)?;
    ensure!(
        matches!(shape, SynthConfig::OneB | SynthConfig::ThreeB | SynthConfig::EightB),
        "--config takes 1b, 3b or 8b"
    );
    let check_layers = args.check_layers.or(if shape == SynthConfig::OneB { None } else { Some(4) });
    // The chapters' --check runs use `model`; the agreement with transformers, `full_model`.
    let (model, full_model) = match &args.model {
        Some(dir) => (dir.clone(), dir.clone()),
        None if !needs_model => (args.work_dir.clone(), args.work_dir.clone()),
        None => {
            let folder = |suffix: &str| PathBuf::from(format!("{}-{suffix}", args.work_dir.display()));
            let full = folder(&args.config);
            let full_needed = check_layers.is_none() || (!args.sanitize_only && !args.no_agreement);
            let full_model = if full_needed { Some(synthetic_model(shape, None, &full, seed)?) } else { None };
            let model = match check_layers {
                None => full.clone(),
                Some(layers) => {
                    let dir = folder(&format!("{}-{layers}-layers", args.config));
                    synthetic_model(shape, Some(layers), &dir, seed)?
                }
            };
            (model, full_model.unwrap_or(full))
        }
    };
    let prompt = random_prompt(seed);
    println!("gpu-check: prompt {prompt:?}");
    let mut rows = Vec::new();
    let chosen = |folder: &str| args.only.is_empty() || args.only.iter().any(|nn| folder.starts_with(nn.as_str()));
    let chapters: Vec<String> =
        paths::chapters()?.into_iter().map(|(folder, _)| folder).filter(|folder| chosen(folder)).collect();
    if !args.sanitize_only {
        for folder in &chapters {
            let name = paths::package_name(folder);
            let binary = bin_dir.join(&name);
            if !binary.exists() {
                rows.push(Row::note(&name, &format!("no binary in {}", bin_dir.display()), "SKIPPED"));
                continue;
            }
            let tokenizer = args.tokenizer.as_deref();
            rows.extend(run_chapter(&name, &binary, &check_args(folder, &model, tokenizer, &prompt, None))?);
            if batches(folder) {
                let mut args = check_args(folder, &model, tokenizer, &prompt, None);
                args.push("--static".into());
                let checked = run_chapter(&name, &binary, &args)?;
                rows.extend(checked.into_iter().map(|row| Row { what: format!("{} [static]", row.what), ..row }));
            }
            if folder.starts_with("10") {
                rows.extend(paged_check_variants(folder, &name, &binary, &model, tokenizer, &prompt)?);
            }
            // Attention must handle the whole context: chapter 6 is checked on a ~2,000-token prompt too.
            if folder.starts_with("06") {
                let long_prompt = "The quick brown fox jumps over the lazy dog. ".repeat(200);
                let long = run_chapter(&name, &binary, &check_args(folder, &model, tokenizer, &long_prompt, None))?;
                rows.extend(
                    long.into_iter().map(|row| Row { what: format!("{} [~2,010-token prompt]", row.what), ..row }),
                );
            }
        }
        let (recompute, cached) = (bin_dir.join("ch07-mlp"), bin_dir.join("ch08-kv-cache"));
        if chosen("08") && recompute.exists() && cached.exists() {
            let tokenizer = args.tokenizer.as_deref();
            rows.extend(kv_cache_agreement(&recompute, &cached, &model, tokenizer, &prompt)?);
        }
        let (batched, paged) = (bin_dir.join("ch09-batching"), bin_dir.join("ch10-paged-attention"));
        let tokenizer = args.tokenizer.as_deref();
        let (check_09, check_10) = (chosen("09") && batched.exists(), chosen("10") && paged.exists());
        if (check_09 || check_10) && cached.exists() {
            let workload = batching_workload(seed);
            let expected = alone_ids(&cached, &model, tokenizer, &workload)?;
            let file = write_workload(&args.work_dir, "batching-workload.jsonl", &workload)?;
            for policy in ["--continuous", "--static"].into_iter().filter(|_| check_09) {
                let run = BatchedRun { binary: &batched, model: &model, tokenizer, file: &file, args: &[policy] };
                rows.push(run.agreement(&workload, &expected, &[])?);
            }
            if check_10 {
                // The same workload in the default pool of 128 MiB: the long requests wait for pages.
                for policy in ["--continuous", "--static"] {
                    let run = BatchedRun { binary: &paged, model: &model, tokenizer, file: &file, args: &[policy] };
                    rows.push(run.agreement(&workload, &expected, &[])?);
                }
            }
        }
        if chosen("10") && cached.exists() && batched.exists() && paged.exists() {
            // Short requests in a pool of 16 pages, and one that could never fit in it.
            let workload = small_pool_workload(seed);
            let expected = alone_ids(&cached, &model, tokenizer, &workload)?;
            let file = write_workload(&args.work_dir, "small-pool-workload.jsonl", &workload)?;
            let run = BatchedRun { binary: &batched, model: &model, tokenizer, file: &file, args: &["--continuous"] };
            rows.push(run.agreement(&workload, &expected, &[])?);
            for admission in ["conservative", "optimistic"] {
                for policy in ["--continuous", "--static"] {
                    let args = [policy, "--kv-cache-mib", "8", "--admission", admission];
                    let run = BatchedRun { binary: &paged, model: &model, tokenizer, file: &file, args: &args };
                    rows.push(run.agreement(&workload, &expected, &[SMALL_POOL_TOO_LARGE])?);
                }
            }
        }
        let engine = latest_generating_chapter(&bin_dir)?;
        let engine_chosen =
            |e: &PathBuf| e.file_name().and_then(|n| n.to_str()?.strip_prefix("ch")).is_some_and(chosen);
        if let Some(engine) = engine.filter(engine_chosen) {
            let prompts = [prompt.clone(), "Say hello.".to_string(), "Tell me about it.".to_string()];
            if !args.no_agreement {
                rows.extend(transformers_agreement(&engine, &full_model, args.tokenizer.as_deref(), &prompts)?);
            }
            if !args.no_drift && shape != SynthConfig::OneB {
                let name = engine.file_name().unwrap().to_string_lossy().into_owned();
                rows.push(Row::note(&name, "drift against transformers: its fixed set of models is 1B", "SKIPPED"));
            } else if !args.no_drift {
                rows.extend(drift_ratios(&engine, &args.drift_dir, args.tokenizer.as_deref())?);
            }
        }
    }
    let mut findings = Vec::new();
    if let Some(sanitizer) = &sanitizer {
        let label = match &args.model {
            Some(dir) => {
                dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned())
            }
            None => "1B".to_string(),
        };
        let tiny = args.sanitize_dir.join("tiny");
        if tools.iter().any(|tool| tool.on_tiny()) {
            synthetic_model(SynthConfig::Tiny, None, &tiny, seed)?;
        }
        let models = SanitizeModels { large: &model, large_label: &label, tiny: &tiny };
        let plan = SanitizePlan {
            tools: &tools,
            models,
            tokenizer: args.tokenizer.as_deref(),
            prompt: &prompt,
            leak_check: !args.no_leak_check,
            extra_options: &args.sanitizer_option,
        };
        let (sanitized, found) =
            sanitize(sanitizer, &bin_dir, &args.sanitize_dir, &chapters, &plan, args.sanitize_only)?;
        rows.extend(sanitized);
        findings = found;
    }
    let source = match &args.model {
        Some(dir) => dir.display().to_string(),
        None if needs_model => match check_layers {
            None => format!("synthetic {}, seed {seed}", args.config),
            Some(layers) => format!(
                "synthetic {}, seed {seed}: --check runs at {layers} layers, agreement at full depth",
                args.config
            ),
        },
        None => format!("synthetic tiny, seed {seed}"),
    };
    print_table(&rows, &source, &prompt);
    for (heading, lines) in &findings {
        println!();
        println!("{heading}");
        for line in lines {
            println!("  {line}");
        }
    }
    let failed = rows.iter().filter(|r| r.verdict == "FAIL").count();
    if failed > 0 {
        bail!("{failed} check(s) failed");
    }
    Ok(())
}

/// Chapter 10's `--check` again: in a pool of 8 pages, where one request runs at a time and
/// the others wait for its pages; the same pool under optimistic admission, where requests
/// are preempted and resumed; and with a ~310-token first prompt, long enough (20 pages and
/// more) that decode attention splits its positions among blocks (flash-decoding), with and
/// without the split. (Longer prompts split more ways but cost the CPU reference minutes.)
fn paged_check_variants(
    folder: &str,
    name: &str,
    binary: &Path,
    model: &Path,
    tokenizer: Option<&Path>,
    prompt: &str,
) -> Result<Vec<Row>> {
    let long_prompt = "The quick brown fox jumps over the lazy dog. ".repeat(30);
    let small_pool = ["--kv-cache-mib", "4"];
    let variants: [(&str, &[&str], &str); 4] = [
        (prompt, &small_pool, "4 MiB pool"),
        (prompt, &["--kv-cache-mib", "4", "--admission", "optimistic"], "4 MiB pool, optimistic"),
        (&long_prompt, &[], "~310-token prompt"),
        (&long_prompt, &["--no-split-kv"], "~310-token prompt, no split"),
    ];
    let mut rows = Vec::new();
    for (text, extra, label) in variants {
        let mut args = check_args(folder, model, tokenizer, text, None);
        args.extend(extra.iter().map(|a| a.to_string()));
        let checked = run_chapter(name, binary, &args)?;
        rows.extend(checked.into_iter().map(|row| Row { what: format!("{} [{label}]", row.what), ..row }));
    }
    Ok(rows)
}

/// A chapter's `--check` command line. Chapter 1 has no tokenizer and takes no prompt; from
/// chapter 2 on every binary takes a prompt, and from chapter 7 on (they generate) how many
/// tokens to generate after it, when `max_new_tokens` is given (else the chapter's default).
fn check_args(
    folder: &str,
    model: &Path,
    tokenizer: Option<&Path>,
    prompt: &str,
    max_new_tokens: Option<usize>,
) -> Vec<String> {
    let mut args = vec!["--model".into(), model.display().to_string(), "--check".into()];
    if folder >= "02" {
        if let Some(tokenizer) = tokenizer {
            args.extend(["--tokenizer".into(), tokenizer.display().to_string()]);
        }
        args.push(prompt.to_string());
        if batches(folder) {
            args.push(max_new_tokens.unwrap_or(BATCH_CHECK_TOKENS).to_string());
            args.extend(BATCH_CHECK_PROMPTS.map(String::from));
            args.extend(["--max-batch".into(), "2".into()]);
        } else if let Some(tokens) = max_new_tokens.filter(|_| generates(folder)) {
            args.push(tokens.to_string());
        }
    }
    args
}

/// Whether a chapter's binary generates text (chapter 7 on), and so takes `MAX_NEW_TOKENS`.
fn generates(folder: &str) -> bool {
    folder >= "07"
}

/// Whether a chapter's binary serves several requests at once (chapter 9 on).
fn batches(folder: &str) -> bool {
    folder >= "09"
}

/// From chapter 9 on, `--check` runs four requests in two slots, so that batches form,
/// slots are refilled, and the last request (which the check samples with the first)
/// runs beside the others' ends.
const BATCH_CHECK_PROMPTS: [&str; 3] = ["Say hello.", "Tell me about it.", "Write a haiku about Rust and GPUs."];
const BATCH_CHECK_TOKENS: usize = 64;

/// The ids a generating chapter printed for its first (or only) request.
fn first_generated_ids(stdout: &str) -> &str {
    let prefixes = ["generated ids: ", "request 0 ids: "];
    stdout.lines().find_map(|line| prefixes.iter().find_map(|p| line.strip_prefix(p))).unwrap_or_default()
}

/// A prompt of a few words drawn with `seed`, so each run checks different tokens.
fn random_prompt(seed: u64) -> String {
    const WORDS: [&str; 24] = [
        "explain",
        "why",
        "the",
        "sky",
        "is",
        "blue",
        "in",
        "two",
        "sentences",
        "please",
        "write",
        "a",
        "haiku",
        "about",
        "Rust",
        "GPUs",
        "tokens",
        "and",
        "memory",
        "bandwidth",
        "café",
        "naïve",
        "🙂",
        "42",
    ];
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let count = 4 + (next() % 12) as usize;
    let words: Vec<&str> = (0..count).map(|_| WORDS[(next() % WORDS.len() as u64) as usize]).collect();
    words.join(" ")
}

fn time_seed() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) % 1_000_000
}

/// Writes a synthetic checkpoint of `which`'s shape, with only `layers` layers when given.
pub fn synthetic_model(which: SynthConfig, layers: Option<usize>, dir: &Path, seed: u64) -> Result<PathBuf> {
    let depth = layers.map_or_else(String::new, |n| format!(", {n} layers"));
    println!("gpu-check: writing a synthetic {which:?} checkpoint (seed {seed}{depth}) into {}", dir.display());
    let start = Instant::now();
    // A reduced checkpoint would fit in one file; shards of 1 GB make the --check runs read
    // a sharded checkpoint too, as the full-depth 3B and 8B ones are.
    let shard_bytes = layers.map(|_| 1_000_000_000);
    let summary = write_checkpoint_with(which, seed, dir, &SynthOptions { layers, shard_bytes })?;
    println!("gpu-check: {} file(s) written in {:.1} s", summary.files, start.elapsed().as_secs_f64());
    Ok(dir.to_path_buf())
}

/// The binary of the last chapter present that generates text (chapter 7 on).
fn latest_generating_chapter(bin_dir: &Path) -> Result<Option<PathBuf>> {
    let generating = paths::chapters()?.into_iter().filter(|(folder, _)| generates(folder));
    Ok(generating.map(|(folder, _)| bin_dir.join(paths::package_name(&folder))).rfind(|b| b.exists()))
}

/// Tokens generated per prompt when chapter 8's cached decode is compared with chapter 7.
const KV_CACHE_AGREEMENT_TOKENS: usize = 64;

/// Chapter 8's greedy tokens, decoded from the KV cache, against chapter 7's, recomputed
/// from the whole sequence, on prompts that reach the budget, an end token, and the context
/// limit: the same ids and the same reason to stop.
fn kv_cache_agreement(
    recompute: &Path,
    cached: &Path,
    model: &Path,
    tokenizer: Option<&Path>,
    prompt: &str,
) -> Result<Vec<Row>> {
    let near_the_limit = "The quick brown fox jumps over the lazy dog. ".repeat(200);
    let prompts = [
        (prompt.to_string(), "the drawn prompt"),
        ("Tell me about it.".to_string(), "\"Tell me about it.\", which ends with <|eot_id|>"),
        (near_the_limit, "a 2,011-token prompt, up to the context limit"),
    ];
    let mut rows = Vec::new();
    for (text, label) in &prompts {
        let run = |binary: &Path| -> Result<(Vec<u32>, String)> {
            let mut command = Command::new(binary);
            command.arg("--model").arg(model);
            if let Some(tokenizer) = tokenizer {
                command.arg("--tokenizer").arg(tokenizer);
            }
            let stdout = capture(command.arg(text).arg(KV_CACHE_AGREEMENT_TOKENS.to_string()))?;
            let ids = stdout.lines().find_map(|line| line.strip_prefix("generated ids: ")).unwrap_or_default();
            let stop = stdout.lines().find_map(|line| line.split_once("(stopped: ")).map(|(_, why)| why.to_string());
            Ok((parse_ids(ids)?, stop.unwrap_or_default()))
        };
        let ((theirs, their_stop), (ours, our_stop)) = (run(recompute)?, run(cached)?);
        let differing = ours.iter().zip(&theirs).filter(|(a, b)| a != b).count() + ours.len().abs_diff(theirs.len());
        let same_stop = our_stop == their_stop;
        rows.push(Row {
            chapter: "ch08-kv-cache".into(),
            what: format!("greedy ids vs chapter 7's (recomputing), {label}"),
            measured: format!(
                "{differing} of {} ids differ; stopped: {} {}",
                theirs.len().max(ours.len()),
                our_stop.trim_end_matches(')'),
                if same_stop { "(same)" } else { "(chapter 7 differs)" }
            ),
            limit: "0, same stop".into(),
            verdict: if differing == 0 && same_stop { "PASS" } else { "FAIL" }.into(),
        });
    }
    Ok(rows)
}

/// One request of the batching workload.
#[derive(Debug, Clone, PartialEq)]
struct BatchRequest {
    prompt: String,
    max_new_tokens: usize,
    system: Option<String>,
}

/// Requests in the batching agreement, and the slots they share: more requests than slots.
const BATCHING_REQUESTS: usize = 24;
const BATCHING_SLOTS: usize = 8;
const _: () = assert!(BATCHING_REQUESTS > BATCHING_SLOTS, "the workload must queue for slots");

/// A mixed workload drawn with `seed`: prompts from the shortest the chat format allows
/// (a word, 11 tokens) to about 1,500 tokens, budgets from 1 to 300, some requests that end
/// at an end token, one with a system prompt.
fn batching_workload(seed: u64) -> Vec<BatchRequest> {
    let mut state = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut next = move |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    (0..BATCHING_REQUESTS)
        .map(|i| {
            let words = match i % 4 {
                0 => 1,
                1 => 1 + next(40),
                2 => 40 + next(300),
                _ => 300 + next(1100),
            };
            let phrase = random_prompt(seed + i as u64);
            let prompt = match i {
                // The synthetic model answers these with an end token within a few tokens.
                3 | 11 => "Tell me about it.".to_string(),
                _ => phrase.split(' ').cycle().take(words).collect::<Vec<_>>().join(" "),
            };
            let max_new_tokens = if i == 1 { 1 } else { 1 + next(300) };
            let system = (i == 5).then(|| "Answer in one sentence.".to_string());
            BatchRequest { prompt, max_new_tokens, system }
        })
        .collect()
}

/// A workload for a pool of 16 pages (`--kv-cache-mib 8` on 1B, 256 positions): short
/// prompts and budgets, so that two or three fit at a time and the rest wait, and request
/// [`SMALL_POOL_TOO_LARGE`], a prompt longer than the whole pool, which must be rejected
/// while the others run.
fn small_pool_workload(seed: u64) -> Vec<BatchRequest> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    (0..SMALL_POOL_REQUESTS)
        .map(|i| {
            let words = if i == SMALL_POOL_TOO_LARGE { 400 } else { 1 + next(40) };
            let phrase = random_prompt(seed + 100 + i as u64);
            let prompt = match i {
                2 => "Tell me about it.".to_string(),
                _ => phrase.split(' ').cycle().take(words).collect::<Vec<_>>().join(" "),
            };
            // The synthetic model ends "Tell me about it." within a few tokens: room for it.
            let max_new_tokens = if i == 2 { 64 } else { 1 + next(120) };
            BatchRequest { prompt, max_new_tokens, system: None }
        })
        .collect()
}

const SMALL_POOL_REQUESTS: usize = 16;
const SMALL_POOL_TOO_LARGE: usize = 5;

/// Chapter 8's greedy ids for each request of `workload`, run alone.
fn alone_ids(alone: &Path, model: &Path, tokenizer: Option<&Path>, workload: &[BatchRequest]) -> Result<Vec<Vec<u32>>> {
    println!("gpu-check: chapter 8 on each of {} requests alone", workload.len());
    let mut expected = Vec::new();
    for request in workload {
        let mut command = Command::new(alone);
        command.arg("--model").arg(model);
        if let Some(tokenizer) = tokenizer {
            command.arg("--tokenizer").arg(tokenizer);
        }
        if let Some(system) = &request.system {
            command.args(["--system", system]);
        }
        let stdout = capture(command.arg(&request.prompt).arg(request.max_new_tokens.to_string()))?;
        expected.push(parse_ids(first_generated_ids(&stdout))?);
    }
    Ok(expected)
}

/// `workload` as a prompts file in `work_dir`.
fn write_workload(work_dir: &Path, name: &str, workload: &[BatchRequest]) -> Result<PathBuf> {
    std::fs::create_dir_all(work_dir)?;
    let file = work_dir.join(name);
    let lines: Vec<String> = workload
        .iter()
        .map(|r| {
            let mut line = serde_json::json!({"prompt": r.prompt, "max_new_tokens": r.max_new_tokens});
            if let Some(system) = &r.system {
                line["system"] = serde_json::json!(system);
            }
            line.to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n")?;
    Ok(file)
}

/// One run of a batching chapter over a prompts file, `BATCHING_SLOTS` at a time.
struct BatchedRun<'a> {
    binary: &'a Path,
    model: &'a Path,
    tokenizer: Option<&'a Path>,
    file: &'a Path,
    /// The policy, and any more options (chapter 10's pool size).
    args: &'a [&'a str],
}

impl BatchedRun<'_> {
    /// Every request's greedy ids against chapter 8's for that request alone: the same ids,
    /// request by request, except the `rejected` ones, which must be refused with their
    /// message and no answer. Chapter 10's runs add `--stats`: the pool must end with every
    /// page free.
    fn agreement(&self, workload: &[BatchRequest], expected: &[Vec<u32>], rejected: &[usize]) -> Result<Row> {
        let name = self.binary.file_name().unwrap().to_string_lossy().into_owned();
        let paged = name.starts_with("ch10");
        let mut command = Command::new(self.binary);
        command.arg("--model").arg(self.model).args(self.args);
        if let Some(tokenizer) = self.tokenizer {
            command.arg("--tokenizer").arg(tokenizer);
        }
        command.args(["--max-batch", &BATCHING_SLOTS.to_string(), "--prompts-file"]).arg(self.file);
        if paged {
            command.arg("--stats");
        }
        println!("gpu-check: {command:?}");
        let output = command.output().with_context(|| format!("cannot run {command:?}"))?;
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        let mut got: Vec<Option<Vec<u32>>> = vec![None; workload.len()];
        for line in stdout.lines() {
            let Some((request, ids)) = line.strip_prefix("request ").and_then(|rest| rest.split_once(" ids: ")) else {
                continue;
            };
            let index: usize = request.parse().with_context(|| format!("bad request number in {line:?}"))?;
            ensure!(index < got.len() && got[index].is_none(), "request {index} was answered twice or is unknown");
            got[index] = Some(parse_ids(ids)?);
        }
        let served = |i: &usize| !rejected.contains(i);
        let differing: Vec<usize> =
            (0..workload.len()).filter(served).filter(|&i| got[i].as_ref() != Some(&expected[i])).collect();
        let refused =
            rejected.iter().all(|&i| got[i].is_none() && stderr.contains(&format!("error: request {i} rejected")))
                && (rejected.is_empty() == output.status.success());
        let end_tokens =
            (0..workload.len()).filter(served).filter(|&i| expected[i].last().is_some_and(|&id| id >= 128_000)).count();
        let first = differing.first().map_or(String::new(), |&i| {
            let ours = got[i].as_ref().map_or(0, |ids| ids.len());
            format!(" (first: request {i}, {ours} ids batched, {} alone)", expected[i].len())
        });
        let stat = |label: &str| stdout.lines().find_map(|l| l.trim().strip_prefix(label)).map(str::to_string);
        let waits = stat("admission waits: ").unwrap_or_default();
        let free = stat("free pages at the end: ").unwrap_or_default();
        let pages_back = !paged || free.contains("none leaked");
        // A small pool must make requests wait, or it tests nothing beyond the default one.
        let waited = !self.args.contains(&"--kv-cache-mib") || waits.parse::<usize>().is_ok_and(|w| w > 0);
        // Optimistic admission in a small pool must preempt, or resuming is not tested.
        let optimistic = self.args.contains(&"optimistic");
        let preemptions = stat("preemptions: ").unwrap_or_default();
        let count = preemptions.split(',').next().and_then(|n| n.parse::<usize>().ok());
        let preempted = !optimistic || count.is_some_and(|n| n > 0);
        let mut measured = format!(
            "{} of {} requests differ{first}; {end_tokens} stopped at an end token",
            differing.len(),
            workload.len() - rejected.len()
        );
        if !rejected.is_empty() {
            measured += &format!("; request {rejected:?} rejected: {}", if refused { "yes" } else { "NO" });
        }
        if paged {
            measured += &format!("; {waits} admission waits; free pages at the end {free}");
        }
        if optimistic {
            measured += &format!("; preemptions: {preemptions}");
        }
        let lengths: Vec<usize> = workload.iter().map(|r| r.prompt.split(' ').count()).collect();
        let budgets: Vec<usize> = workload.iter().map(|r| r.max_new_tokens).collect();
        let what = format!(
            "greedy ids of every request vs chapter 8's alone, {}: {} requests of {}-{} words and budgets {}-{}, {BATCHING_SLOTS} at a time",
            self.args.join(" ").trim_start_matches("--"),
            workload.len(),
            lengths.iter().min().unwrap_or(&0),
            lengths.iter().max().unwrap_or(&0),
            budgets.iter().min().unwrap_or(&0),
            budgets.iter().max().unwrap_or(&0)
        );
        let pass = differing.is_empty() && end_tokens > 0 && refused && pages_back && waited && preempted;
        if !pass && !output.status.success() && rejected.is_empty() {
            eprint!("{stderr}");
        }
        Ok(Row { chapter: name, what, measured, limit: "0".into(), verdict: if pass { "PASS" } else { "FAIL" }.into() })
    }
}

/// Tokens generated per prompt, compared with the engine's.
const AGREEMENT_TOKENS: usize = 32;

/// Our greedy tokens against transformers' `generate()` on the GPU, in fp32 (must agree)
/// and bf16 (reported), for the same prompt ids. Skipped, and said so, without torch.
fn transformers_agreement(
    engine: &Path,
    model: &Path,
    tokenizer: Option<&Path>,
    prompts: &[String],
) -> Result<Vec<Row>> {
    let name = engine.file_name().unwrap().to_string_lossy().into_owned();
    let torch = Command::new("python3").args(["-c", "import torch, transformers"]).output();
    if !torch.is_ok_and(|o| o.status.success()) {
        return Ok(vec![Row::note(
            &name,
            "agreement with transformers: python3 with torch + transformers not found",
            "SKIPPED",
        )]);
    }
    let tokenizer_args: Vec<String> =
        tokenizer.map(|t| vec!["--tokenizer".to_string(), t.display().to_string()]).unwrap_or_default();
    let mut prompt_ids = Vec::new();
    let mut ours = Vec::new();
    for prompt in prompts {
        let ids = capture(Command::new(engine).args(&tokenizer_args).args(["chat", prompt]))?;
        prompt_ids.push(ids.trim().to_string());
        let run = capture(
            Command::new(engine)
                .arg("--model")
                .arg(model)
                .args(&tokenizer_args)
                .arg(prompt)
                .arg(AGREEMENT_TOKENS.to_string()),
        )?;
        ours.push(parse_ids(first_generated_ids(&run))?);
    }
    let script = paths::root()?.join("shared/reference/python/hf_greedy.py");
    let mut python = Command::new("python3");
    python.arg(&script).arg("--model").arg(model).args(["--max-new-tokens", &AGREEMENT_TOKENS.to_string()]);
    for ids in &prompt_ids {
        python.args(["--prompt-ids", ids]);
    }
    let hf = capture(python.args(["--dtypes", "fp32", "bf16"]))?;
    let mut rows = Vec::new();
    for line in hf.lines().filter(|l| l.starts_with('{')) {
        let json: serde_json::Value = serde_json::from_str(line)?;
        let index = json["prompt"].as_u64().context("hf_greedy.py output has no prompt index")? as usize;
        let dtype = json["dtype"].as_str().unwrap_or("?").to_string();
        let theirs: Vec<u32> = json["greedy_ids"]
            .as_array()
            .context("hf_greedy.py output has no greedy_ids")?
            .iter()
            .filter_map(|v| v.as_u64().map(|v| v as u32))
            .collect();
        let differing =
            ours[index].iter().zip(&theirs).filter(|(a, b)| a != b).count() + ours[index].len().abs_diff(theirs.len());
        // fp32 is the ground truth we must match; bf16 transformers rounds differently from us.
        let verdict = match (differing, dtype.as_str()) {
            (0, _) => "PASS",
            (_, "float32") => "FAIL",
            _ => "DIFFERS (not required)",
        };
        rows.push(Row {
            chapter: name.clone(),
            what: format!("greedy ids vs transformers {dtype} generate(), prompt {:?}", prompts[index]),
            measured: format!("{differing} of {} ids differ", theirs.len().max(ours[index].len())),
            limit: "0".into(),
            verdict: verdict.to_string(),
        });
    }
    if rows.is_empty() {
        bail!("hf_greedy.py printed no results:\n{hf}");
    }
    Ok(rows)
}

/// The fixed set of models on which our end-to-end error is compared with transformers' own.
const DRIFT_SEEDS: [u64; 3] = [1, 2, 3];
const DRIFT_PROMPT: &str = "Explain why the sky is blue.";
/// Our error may be at most this many times transformers' bf16 drift.
const DRIFT_RATIO_LIMIT: f64 = 1.5;

/// A model of the fixed set, written into `dir`.
enum DriftModel {
    Synthetic(u64),
    /// transformers' own random initialisation, with Meta's config.json text.
    TransformersInit,
    /// The same with outlier activations planted.
    Outliers,
}

impl DriftModel {
    fn name(&self) -> String {
        match self {
            DriftModel::Synthetic(seed) => format!("synthetic 1B seed {seed}"),
            DriftModel::TransformersInit => "transformers-initialised 1B".to_string(),
            DriftModel::Outliers => "transformers-initialised 1B with outliers".to_string(),
        }
    }

    fn write(&self, dir: &Path) -> Result<()> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("cannot clear {}", dir.display()))?;
        }
        match self {
            DriftModel::Synthetic(seed) => {
                write_checkpoint(SynthConfig::OneB, *seed, dir)?;
            }
            DriftModel::TransformersInit | DriftModel::Outliers => {
                std::fs::create_dir_all(dir)?;
                std::fs::write(dir.join("config.json"), SynthConfig::OneB.config_json())?;
                let script = paths::root()?.join("shared/reference/python/hf_random_model.py");
                let mut python = Command::new("python3");
                python.arg(&script).arg("--out").arg(dir);
                if matches!(self, DriftModel::Outliers) {
                    python.arg("--outliers");
                }
                print!("{}", capture(&mut python)?);
            }
        }
        Ok(())
    }
}

/// On each model of the fixed set: the engine's own `--check` rows, and its end-to-end
/// logits error divided by transformers' bf16-vs-fp32 drift on the same ids, which must be
/// at most [`DRIFT_RATIO_LIMIT`]: our limits come from arithmetic, and this shows the
/// arithmetic is no worse than what people otherwise run.
fn drift_ratios(engine: &Path, dir: &Path, tokenizer: Option<&Path>) -> Result<Vec<Row>> {
    let name = engine.file_name().unwrap().to_string_lossy().into_owned();
    let torch = Command::new("python3").args(["-c", "import torch, transformers"]).output();
    if !torch.is_ok_and(|o| o.status.success()) {
        return Ok(vec![Row::note(
            &name,
            "bf16 drift vs transformers: python3 with torch + transformers not found",
            "SKIPPED",
        )]);
    }
    let tokenizer_args: Vec<String> =
        tokenizer.map(|t| vec!["--tokenizer".to_string(), t.display().to_string()]).unwrap_or_default();
    let ids = capture(Command::new(engine).args(&tokenizer_args).args(["chat", DRIFT_PROMPT]))?.trim().to_string();
    let mut models: Vec<DriftModel> = DRIFT_SEEDS.iter().map(|&seed| DriftModel::Synthetic(seed)).collect();
    models.extend([DriftModel::TransformersInit, DriftModel::Outliers]);
    let mut rows = Vec::new();
    for model in models {
        println!("gpu-check: writing the {} to {}", model.name(), dir.display());
        model.write(dir)?;
        let mut args = vec!["--model".to_string(), dir.display().to_string(), "--check".to_string()];
        args.extend(tokenizer_args.iter().cloned());
        args.extend([DRIFT_PROMPT.to_string(), "8".to_string()]);
        let checked = run_chapter(&name, engine, &args)?;
        let ours = checked
            .iter()
            .find(|r| r.what.contains("logits of the prompt's last position"))
            .and_then(Row::relative_error);
        rows.extend(checked.into_iter().map(|row| Row { what: format!("{} [{}]", row.what, model.name()), ..row }));
        let script = paths::root()?.join("shared/reference/python/hf_bf16_drift.py");
        let drift = capture(Command::new("python3").arg(&script).arg("--model").arg(dir).args(["--prompt-ids", &ids]))?;
        print!("{drift}");
        let theirs = drift.split("last-position logits ").nth(1).and_then(|t| t.trim().parse::<f64>().ok());
        let what = format!("end-to-end logits error / transformers' bf16 drift [{}]", model.name());
        rows.push(match (ours, theirs) {
            (Some(ours), Some(theirs)) => {
                let ratio = ours / theirs;
                Row {
                    chapter: name.clone(),
                    what,
                    measured: format!("ours {ours:.2e}, transformers bf16 {theirs:.2e}: ratio {ratio:.2}"),
                    limit: format!("{DRIFT_RATIO_LIMIT}"),
                    verdict: if ratio <= DRIFT_RATIO_LIMIT { "PASS" } else { "FAIL" }.to_string(),
                }
            }
            _ => Row::note(&name, &format!("{what}: a figure is missing"), "FAIL"),
        });
    }
    std::fs::remove_dir_all(dir).ok();
    Ok(rows)
}

/// Tokens each generating chapter makes under compute-sanitizer: the first comes from the
/// prompt's pass, the later ones from the generation loop, and each costs a whole forward
/// pass at the sanitizer's slowdown.
const SANITIZE_NEW_TOKENS: usize = 4;
/// How many of a failing run's sanitizer lines are printed, after it and after the table.
const FINDING_LINES: usize = 20;

/// A compute-sanitizer tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Tool {
    /// Out-of-bounds and misaligned accesses, CUDA API errors, leaks.
    Memcheck,
    /// Hazards between threads on shared memory.
    Racecheck,
    /// Reads of global memory nothing wrote.
    Initcheck,
    /// Invalid uses of barriers and warp synchronisation.
    Synccheck,
}

impl Tool {
    const ALL: [Tool; 4] = [Tool::Memcheck, Tool::Racecheck, Tool::Initcheck, Tool::Synccheck];

    fn name(self) -> &'static str {
        match self {
            Tool::Memcheck => "memcheck",
            Tool::Racecheck => "racecheck",
            Tool::Initcheck => "initcheck",
            Tool::Synccheck => "synccheck",
        }
    }

    /// racecheck follows every shared-memory access and initcheck every byte of global
    /// memory, far too slow at 1B; synccheck is cheap, but the tiny model shows as much.
    fn on_tiny(self) -> bool {
        self != Tool::Memcheck
    }

    /// The sanitizer's options for this tool. memcheck also looks for leaks unless told not
    /// to: cudarc frees each buffer when its owner is dropped and releases the context when
    /// the program ends, so memory still allocated then is a finding (counted among the errors).
    ///
    /// racecheck runs without `--error-exitcode`: its races are counted from its report, by
    /// kernel (see [`SanitizerReport::races_in`]), so the exit status is the program's own.
    fn options(self, leak_check: bool) -> Vec<&'static str> {
        let mut options = vec!["--tool", self.name()];
        if self == Tool::Memcheck && leak_check {
            options.extend(["--leak-check", "full"]);
        }
        if self != Tool::Racecheck {
            options.extend(["--error-exitcode", "1"]);
        }
        options
    }
}

/// The checkpoints of the sanitizer runs: memcheck's, and the tiny one of the other tools.
struct SanitizeModels<'a> {
    large: &'a Path,
    /// How rows name `large`: `1B`, or the name of the --model folder.
    large_label: &'a str,
    tiny: &'a Path,
}

/// What the sanitizer runs of every chapter are made of.
struct SanitizePlan<'a> {
    tools: &'a [Tool],
    models: SanitizeModels<'a>,
    tokenizer: Option<&'a Path>,
    prompt: &'a str,
    /// memcheck's `--leak-check full`.
    leak_check: bool,
    /// More options for compute-sanitizer, given to every tool.
    extra_options: &'a [String],
}

/// One compute-sanitizer run over one chapter's `--check`.
#[derive(Debug)]
struct SanitizerRun {
    tool: Tool,
    /// The row's "compared" cell.
    what: String,
    chapter_args: Vec<String>,
}

impl SanitizePlan<'_> {
    /// The runs for the chapter in `folder`, one per tool, in the order of `tools`.
    fn runs(&self, folder: &str) -> Vec<SanitizerRun> {
        let tokens = generates(folder).then_some(SANITIZE_NEW_TOKENS);
        self.tools
            .iter()
            .map(|&tool| {
                let (model, label) = match tool.on_tiny() {
                    true => (self.models.tiny, "tiny"),
                    false => (self.models.large, self.models.large_label),
                };
                let on = match tokens {
                    Some(tokens) => format!("{label}, {tokens} new tokens"),
                    None => label.to_string(),
                };
                SanitizerRun {
                    tool,
                    what: format!("compute-sanitizer {} on --check ({on})", tool.name()),
                    chapter_args: check_args(folder, model, self.tokenizer, self.prompt, tokens),
                }
            })
            .collect()
    }

    /// compute-sanitizer's arguments for one run: the tool's options, the extra ones, the
    /// program and its arguments.
    fn sanitizer_args(&self, tool: Tool, binary: &Path, chapter_args: &[String]) -> Vec<String> {
        let mut args: Vec<String> = tool.options(self.leak_check).into_iter().map(String::from).collect();
        args.extend(self.extra_options.iter().cloned());
        args.push(binary.display().to_string());
        args.extend(chapter_args.iter().cloned());
        args
    }
}

/// Where compute-sanitizer may be, in this order: each folder of `PATH`, `$CUDA_HOME/bin`,
/// `/usr/local/cuda/bin`.
pub fn cuda_tool_candidates(tool: &str, path: Option<&OsStr>, cuda_home: Option<&OsStr>) -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = path
        .map(|path| std::env::split_paths(path).filter(|dir| !dir.as_os_str().is_empty()).collect())
        .unwrap_or_default();
    candidates.extend(cuda_home.filter(|home| !home.is_empty()).map(|home| Path::new(home).join("bin")));
    candidates.push(PathBuf::from("/usr/local/cuda/bin"));
    candidates.into_iter().map(|dir| dir.join(tool)).collect()
}

/// The first of [`cuda_tool_candidates`] that exists: `PATH`, then `$CUDA_HOME/bin`, then
/// `/usr/local/cuda/bin`.
pub fn find_cuda_tool(tool: &str) -> Option<PathBuf> {
    let cuda_home = std::env::var_os("CUDA_HOME");
    let candidates = cuda_tool_candidates(tool, std::env::var_os("PATH").as_deref(), cuda_home.as_deref());
    candidates.into_iter().find(|candidate| candidate.is_file())
}

/// compute-sanitizer, found by [`find_cuda_tool`], with its version printed.
fn find_sanitizer() -> Result<PathBuf> {
    let Some(sanitizer) = find_cuda_tool("compute-sanitizer") else {
        let home = match std::env::var_os("CUDA_HOME") {
            Some(home) => format!("CUDA_HOME is {}", Path::new(&home).display()),
            None => "CUDA_HOME is not set".to_string(),
        };
        bail!(
            "compute-sanitizer not found on PATH, in $CUDA_HOME/bin ({home}) or in /usr/local/cuda/bin; \
             --sanitize needs it (it comes with the CUDA toolkit)"
        );
    };
    let version = Command::new(&sanitizer).arg("--version").output().ok().and_then(|output| {
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.lines().find(|line| line.starts_with("Version")).map(str::to_string)
    });
    println!("gpu-check: {} ({})", sanitizer.display(), version.as_deref().unwrap_or("version unknown"));
    Ok(sanitizer)
}

/// What compute-sanitizer printed, read from the lines it marks with `=========`.
#[derive(Debug, Default, PartialEq)]
struct SanitizerReport {
    /// N of `ERROR SUMMARY: N errors` (the largest, were there several).
    errors: Option<u64>,
    /// Errors and warnings of racecheck's `RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)`.
    hazards: Option<(u64, u64)>,
    /// memcheck's `LEAK SUMMARY`, e.g. `0 bytes leaked in 0 allocations`.
    leaks: Option<String>,
    /// The first [`FINDING_LINES`] lines of what it reported: no banner, summaries or host frames.
    findings: Vec<String>,
    /// racecheck's `Race reported between … access at KERNEL+0x…`: the kernel of each race.
    race_kernels: Vec<String>,
}

impl SanitizerReport {
    fn parse(output: &str) -> SanitizerReport {
        let mut report = SanitizerReport::default();
        for line in output.lines() {
            let Some(body) = line.strip_prefix("=========") else { continue };
            let body = body.trim();
            if let Some(rest) = body.strip_prefix("ERROR SUMMARY:") {
                if let Some(errors) = count_of(rest, "error") {
                    report.errors = Some(report.errors.map_or(errors, |e| e.max(errors)));
                }
            } else if let Some(rest) = body.strip_prefix("RACECHECK SUMMARY:") {
                // `H hazards displayed (E errors, W warnings)`; without the parenthesis, H errors.
                let split = rest.split_once('(').and_then(|(_, inner)| inner.split_once(')')).map(|(inner, _)| {
                    let (errors, warnings) = inner.split_once(',').unwrap_or((inner, ""));
                    (count_of(errors, "error"), count_of(warnings, "warning"))
                });
                let hazards = match split {
                    Some((Some(errors), Some(warnings))) => Some((errors, warnings)),
                    _ => count_of(rest, "hazard").map(|hazards| (hazards, 0)),
                };
                if let Some((errors, warnings)) = hazards {
                    let (e, w) = report.hazards.unwrap_or((0, 0));
                    report.hazards = Some((e.max(errors), w.max(warnings)));
                }
            } else if let Some(rest) = body.strip_prefix("Error: Race reported between") {
                let kernel = rest.split_once(" at ").map(|(_, at)| at.split('+').next().unwrap_or(at).trim());
                report.race_kernels.push(kernel.unwrap_or("?").to_string());
                if report.findings.len() < FINDING_LINES {
                    report.findings.push(line.trim_end().to_string());
                }
            } else if let Some(rest) = body.strip_prefix("LEAK SUMMARY:") {
                report.leaks = Some(rest.trim().to_string());
            } else if is_finding(body) && report.findings.len() < FINDING_LINES {
                report.findings.push(line.trim_end().to_string());
            }
        }
        report
    }

    /// The errors found, or `None` when the sanitizer printed no summary (it did not finish).
    fn error_count(&self) -> Option<u64> {
        match (self.errors, self.hazards) {
            (None, None) => None,
            (errors, hazards) => Some(errors.unwrap_or(0).max(hazards.map_or(0, |(e, _)| e))),
        }
    }

    /// The races racecheck reported in `kernels` (ours), and in any other kernel. cuBLAS's
    /// Hopper GEMMs (`nvjet…`) hand shared memory between warps through hardware barriers and
    /// asynchronous copies that racecheck does not follow, and it reports races inside them
    /// (seen on the H200 on 2026-12-01): those are shown, but they are not ours to fix.
    fn races_in(&self, kernels: &BTreeSet<String>) -> (u64, u64) {
        let ours = self.race_kernels.iter().filter(|k| kernels.contains(k.as_str())).count() as u64;
        (ours, self.race_kernels.len() as u64 - ours)
    }

    /// `N errors`, with racecheck's warnings and any memory leaked.
    fn describe(&self, errors: u64) -> String {
        let mut text = plural(errors, "error");
        if let Some((_, warnings)) = self.hazards {
            text += &format!(", {}", plural(warnings, "warning"));
        }
        if let Some(leaks) = self.leaks.as_ref().filter(|leaks| !leaks.starts_with("0 bytes")) {
            text += &format!(" ({leaks})");
        }
        text
    }
}

/// `N words` or `1 word` at the start of `text` → N.
fn count_of(text: &str, word: &str) -> Option<u64> {
    let mut words = text.split_whitespace();
    let count = words.next()?.parse().ok()?;
    let unit = words.next()?;
    (unit == word || unit.strip_suffix('s') == Some(word)).then_some(count)
}

fn plural(count: u64, word: &str) -> String {
    format!("{count} {word}{}", if count == 1 { "" } else { "s" })
}

/// Whether a sanitizer line (without its `=========`) says something about an error.
fn is_finding(body: &str) -> bool {
    let noise = ["COMPUTE-SANITIZER", "Host Frame", "Saved host backtrace"];
    !body.is_empty() && !noise.iter().any(|n| body.starts_with(n))
}

/// How the program under the sanitizer ended.
struct Exit {
    success: bool,
    /// As `ExitStatus` says it: `exit status: 1`, `signal: 9 (SIGKILL)`.
    description: String,
}

/// The row of one sanitizer run. It passes when the sanitizer printed its summary, found
/// nothing, and the program succeeded: a program that failed (or was killed) was not wholly
/// checked, but that is said apart from the sanitizer's own errors.
fn sanitizer_row(chapter: &str, what: &str, report: &SanitizerReport, exit: &Exit, ours: &BTreeSet<String>) -> Row {
    let (measured, pass) = match report.error_count() {
        None => (format!("no ERROR SUMMARY line: the sanitizer did not finish ({})", exit.description), false),
        Some(0) if !exit.success => {
            (format!("0 errors, but the program failed under the sanitizer ({})", exit.description), false)
        }
        Some(errors) if !report.race_kernels.is_empty() => {
            let (in_ours, elsewhere) = report.races_in(ours);
            let mut measured = format!("{} in our kernels", plural(in_ours, "race"));
            if elsewhere > 0 {
                measured += &format!(
                    " ({} inside cuBLAS, not ours; {} in all)",
                    plural(elsewhere, "race"),
                    plural(errors, "error")
                );
            }
            let pass = in_ours == 0 && exit.success;
            if !exit.success {
                measured += &format!(", and the program failed ({})", exit.description);
            }
            (measured, pass)
        }
        Some(errors) => (report.describe(errors), errors == 0 && exit.success),
    };
    Row {
        chapter: chapter.to_string(),
        what: what.to_string(),
        measured,
        limit: "0".into(),
        verdict: if pass { "PASS" } else { "FAIL" }.into(),
    }
}

/// The names of the kernels in `kernels/*.cu` (`extern "C" __global__ void NAME(`).
fn our_kernel_names() -> Result<BTreeSet<String>> {
    let dir = paths::root()?.join("kernels");
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "cu") {
            names.extend(kernel_names(&std::fs::read_to_string(&path)?));
        }
    }
    Ok(names)
}

/// The kernels a CUDA source defines.
fn kernel_names(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    let marker = "__global__ void ";
    for (start, _) in source.match_indices(marker) {
        let rest = &source[start + marker.len()..];
        names.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
    }
    names
}

/// A failing run's heading and lines, printed after the table.
type Finding = (String, Vec<String>);

/// Runs each chapter's `--check` under each tool of `plan`, one after another, one row per
/// run, printing each start and end with its wall time and writing each output to a log in
/// `dir/logs`. Returns the rows and, for each failing run, the first lines it reported.
fn sanitize(
    sanitizer: &Path,
    bin_dir: &Path,
    dir: &Path,
    chapters: &[String],
    plan: &SanitizePlan,
    say_missing: bool,
) -> Result<(Vec<Row>, Vec<Finding>)> {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for folder in chapters {
        let name = paths::package_name(folder);
        let binary = bin_dir.join(&name);
        if !binary.exists() {
            // The normal checks have said so already, unless they were left out.
            if say_missing {
                rows.push(Row::note(&name, &format!("no binary in {}", bin_dir.display()), "SKIPPED"));
            }
            continue;
        }
        runs.extend(plan.runs(folder).into_iter().map(|run| (name.clone(), binary.clone(), run)));
    }
    let ours = our_kernel_names()?;
    let all = Instant::now();
    let mut findings = Vec::new();
    for (index, (name, binary, run)) in runs.iter().enumerate() {
        let args = plan.sanitizer_args(run.tool, binary, &run.chapter_args);
        let log = logs.join(format!("{name}.{}.log", run.tool.name()));
        let counter = format!("sanitizer run {}/{}", index + 1, runs.len());
        println!("gpu-check: {counter} starts: {} {}", sanitizer.display(), args.join(" "));
        let start = Instant::now();
        let mut command = Command::new(sanitizer);
        command.args(&args);
        let (row, mut lines) = match command.output() {
            Err(err) => (Row::note(name, &format!("{}: cannot run it: {err}", run.what), "FAIL"), Vec::new()),
            Ok(output) => {
                write_log(&log, &command, &output, start.elapsed())?;
                let stdout = String::from_utf8_lossy(&output.stdout);
                let stderr = String::from_utf8_lossy(&output.stderr);
                let report = SanitizerReport::parse(&format!("{stdout}\n{stderr}"));
                let exit = Exit { success: output.status.success(), description: output.status.to_string() };
                let mut lines = report.findings.clone();
                if !exit.success {
                    // What the program itself said about its failure: failed checks, its error line.
                    let failed_checks = stdout.lines().filter(|l| l.starts_with("check: ") && l.ends_with(": FAIL"));
                    let errors = stderr.lines().filter(|l| !l.starts_with("=========") && !l.trim().is_empty());
                    lines.extend(failed_checks.chain(errors.take(1)).take(5).map(|l| format!("program: {l}")));
                }
                (sanitizer_row(name, &run.what, &report, &exit, &ours), lines)
            }
        };
        println!(
            "gpu-check: {counter} ends after {} ({} in all): {name}, {}: {}: {}",
            seconds(start.elapsed()),
            seconds(all.elapsed()),
            run.what,
            row.measured,
            row.verdict
        );
        if row.verdict != "PASS" {
            lines.push(format!("whole output: {}", log.display()));
            for line in &lines {
                println!("  {line}");
            }
            findings.push((format!("{name}, {}: {}", run.what, row.measured), lines));
        }
        rows.push(row);
    }
    if !runs.is_empty() {
        println!(
            "gpu-check: {} sanitizer runs took {}; logs in {}",
            runs.len(),
            seconds(all.elapsed()),
            logs.display()
        );
    }
    Ok((rows, findings))
}

/// One sanitizer run's command, exit status, wall time and whole output.
fn write_log(log: &Path, command: &Command, output: &Output, wall: Duration) -> Result<()> {
    let text = format!(
        "command: {command:?}\n{}\nwall time: {}\n\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status,
        seconds(wall),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(log, text).with_context(|| format!("cannot write {}", log.display()))
}

/// `12.3 s`, or `4 min 05 s` from a minute on.
fn seconds(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else {
        let whole = secs.round() as u64;
        format!("{} min {:02} s", whole / 60, whole % 60)
    }
}

/// Runs a command, returning its standard output; a failure is an error with its stderr.
fn capture(command: &mut Command) -> Result<String> {
    let output = command.output().with_context(|| format!("cannot run {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn parse_ids(text: &str) -> Result<Vec<u32>> {
    text.split_whitespace().map(|id| id.parse().with_context(|| format!("{id:?} is not a token id"))).collect()
}

/// Runs one chapter's `--check` and turns its `check:` lines into rows.
fn run_chapter(name: &str, binary: &Path, args: &[String]) -> Result<Vec<Row>> {
    println!("gpu-check: {name} {}", args.join(" "));
    let output =
        Command::new(binary).args(args).output().with_context(|| format!("cannot run {}", binary.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    let mut rows: Vec<Row> = stdout.lines().filter_map(|line| Row::parse(name, line)).collect();
    if !output.status.success() {
        let reason = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("exited with an error");
        rows.push(Row::note(name, reason, "FAIL"));
    } else if rows.is_empty() {
        rows.push(Row::note(name, "printed no check: lines", "FAIL"));
    }
    Ok(rows)
}

impl Row {
    fn note(chapter: &str, what: &str, verdict: &str) -> Row {
        Row {
            chapter: chapter.to_string(),
            what: what.to_string(),
            measured: "-".into(),
            limit: "-".into(),
            verdict: verdict.into(),
        }
    }

    /// Parses `check: WHAT: MEASURED (limit LIMIT): VERDICT` (WHAT holds no ": ").
    fn parse(chapter: &str, line: &str) -> Option<Row> {
        let body = line.strip_prefix("check: ")?;
        let (rest, verdict) = body.rsplit_once(": ")?;
        let (rest, limit) = rest.strip_suffix(')')?.rsplit_once(" (limit ")?;
        let (what, measured) = rest.split_once(": ")?;
        Some(Row {
            chapter: chapter.to_string(),
            what: what.to_string(),
            measured: measured.to_string(),
            limit: limit.to_string(),
            verdict: verdict.trim().to_string(),
        })
    }

    /// The number after `relative error ` in the measured field.
    fn relative_error(&self) -> Option<f64> {
        let after = self.measured.split("relative error ").nth(1)?;
        after.split([',', ' ']).next()?.parse().ok()
    }
}

/// The table of `rows`, under a line naming the model (`source`) and the prompt.
fn print_table(rows: &[Row], source: &str, prompt: &str) {
    println!();
    println!("gpu-check on {source}, prompt {prompt:?}");
    let cells = |r: &Row| [r.chapter.clone(), r.what.clone(), r.measured.clone(), r.limit.clone(), r.verdict.clone()];
    let header = ["chapter", "compared", "measured", "limit", "result"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(cells(row)) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [String; 5]| {
        let padded: Vec<String> =
            cells.iter().zip(widths).map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count()))).collect();
        println!("| {} |", padded.join(" | "));
    };
    line(header);
    println!("|{}|", widths.map(|w| "-".repeat(w + 2)).join("|"));
    for row in rows {
        line(cells(row));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::ffi::OsStr;
    use std::path::{Path, PathBuf};

    use super::{
        BATCH_CHECK_PROMPTS, BATCHING_REQUESTS, batching_workload, check_args, cuda_tool_candidates,
        first_generated_ids, kernel_names, sanitizer_row,
    };
    use super::{Exit, Row, SANITIZE_NEW_TOKENS, SanitizeModels, SanitizePlan, SanitizerReport, Tool};

    #[test]
    fn parses_check_lines() {
        let row = Row::parse(
            "ch04-rmsnorm",
            "check: layer 0 input_layernorm, 24 rows: max abs error 3.1e-2, relative error 2.0e-3 (limit 1.0e-2 relative): PASS",
        )
        .unwrap();
        assert_eq!(row.what, "layer 0 input_layernorm, 24 rows");
        assert_eq!(row.measured, "max abs error 3.1e-2, relative error 2.0e-3");
        assert_eq!(row.limit, "1.0e-2 relative");
        assert_eq!(row.verdict, "PASS");
        assert_eq!(row.relative_error(), Some(2.0e-3));
        let tokens = Row::parse("ch07-mlp", "check: all 8 greedy tokens: 1 of 8 ids differ (limit 0): FAIL").unwrap();
        assert_eq!(
            (tokens.measured.as_str(), tokens.limit.as_str(), tokens.verdict.as_str()),
            ("1 of 8 ids differ", "0", "FAIL")
        );
        assert_eq!(tokens.relative_error(), None);
        assert!(Row::parse("x", "upload 2.47 GB").is_none());
    }

    fn plan<'a>(tools: &'a [Tool], tokenizer: Option<&'a Path>) -> SanitizePlan<'a> {
        SanitizePlan {
            tools,
            models: SanitizeModels { large: Path::new("/tmp/1b"), large_label: "1B", tiny: Path::new("/tmp/tiny") },
            tokenizer,
            prompt: "why is the sky blue",
            leak_check: true,
            extra_options: &[],
        }
    }

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn check_args_follow_each_chapters_command_line() {
        let model = Path::new("/m");
        let tokenizer = Some(Path::new("/t.model"));
        // Chapter 1 takes no tokenizer and no prompt, even when told a number of tokens.
        assert_eq!(check_args("01-weights", model, tokenizer, "hi", Some(4)), strings(&["--model", "/m", "--check"]));
        assert_eq!(
            check_args("03-embedding", model, tokenizer, "hi", Some(4)),
            strings(&["--model", "/m", "--check", "--tokenizer", "/t.model", "hi"])
        );
        assert_eq!(check_args("06-attention", model, None, "hi", None), strings(&["--model", "/m", "--check", "hi"]));
        assert_eq!(check_args("07-mlp", model, None, "hi", None), strings(&["--model", "/m", "--check", "hi"]));
        assert_eq!(check_args("07-mlp", model, None, "hi", Some(4)), strings(&["--model", "/m", "--check", "hi", "4"]));
        assert_eq!(check_args("08-kv-cache", model, None, "hi", Some(2)).last().map(String::as_str), Some("2"));
        // Chapter 9 serves several requests in fewer slots.
        let batched = check_args("09-batching", model, None, "hi", None);
        assert_eq!(&batched[3..5], &strings(&["hi", "64"])[..]);
        assert_eq!(batched.len(), 5 + BATCH_CHECK_PROMPTS.len() + 2);
        assert_eq!(&batched[batched.len() - 2..], &strings(&["--max-batch", "2"])[..]);
    }

    #[test]
    fn the_batching_workload_is_mixed() {
        let workload = batching_workload(7);
        assert_eq!(workload.len(), BATCHING_REQUESTS);
        let words: Vec<usize> = workload.iter().map(|r| r.prompt.split(' ').count()).collect();
        assert_eq!(*words.iter().min().unwrap(), 1);
        assert!(*words.iter().max().unwrap() >= 300);
        assert!(workload.iter().all(|r| (1..=300).contains(&r.max_new_tokens)));
        assert!(workload.iter().any(|r| r.max_new_tokens == 1));
        assert!(workload.iter().any(|r| r.system.is_some()));
        assert_eq!(workload.iter().filter(|r| r.prompt == "Tell me about it.").count(), 2);
        assert_eq!(batching_workload(7), workload, "the same seed, the same workload");
    }

    #[test]
    fn generated_ids_are_found_for_one_request_or_many() {
        assert_eq!(first_generated_ids("x\ngenerated ids: 1 2\n"), "1 2");
        assert_eq!(first_generated_ids("request 0 ids: 3 4\nrequest 1 ids: 5\n"), "3 4");
        assert_eq!(first_generated_ids("nothing"), "");
    }

    #[test]
    fn sanitizer_runs_choose_tool_model_and_tokens() {
        let tokenizer = Path::new("/t.model");
        let plan = plan(&Tool::ALL, Some(tokenizer));
        let runs = plan.runs("07-mlp");
        assert_eq!(runs.iter().map(|r| r.tool).collect::<Vec<_>>(), Tool::ALL);
        let memcheck = &runs[0];
        assert_eq!(memcheck.what, "compute-sanitizer memcheck on --check (1B, 4 new tokens)");
        assert_eq!(
            memcheck.chapter_args,
            strings(&["--model", "/tmp/1b", "--check", "--tokenizer", "/t.model", "why is the sky blue", "4"])
        );
        assert_eq!(SANITIZE_NEW_TOKENS, 4);
        for (run, tool) in runs[1..].iter().zip(["racecheck", "initcheck", "synccheck"]) {
            assert_eq!(run.what, format!("compute-sanitizer {tool} on --check (tiny, 4 new tokens)"));
            assert_eq!(run.chapter_args[..2], strings(&["--model", "/tmp/tiny"]));
            assert_eq!(run.chapter_args.last().unwrap(), "4");
        }
        let ch01 = plan.runs("01-weights");
        assert_eq!(ch01[0].what, "compute-sanitizer memcheck on --check (1B)");
        assert_eq!(ch01[0].chapter_args, strings(&["--model", "/tmp/1b", "--check"]));
        assert_eq!(ch01[2].chapter_args, strings(&["--model", "/tmp/tiny", "--check"]));
        let ch05 = plan.runs("05-rope");
        assert_eq!(ch05[1].what, "compute-sanitizer racecheck on --check (tiny)");
        assert_eq!(ch05[1].chapter_args.last().unwrap(), "why is the sky blue");
        // --sanitize-tool narrows the runs, in its order.
        let only = [Tool::Initcheck];
        let runs = self::plan(&only, None).runs("07-mlp");
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].tool, Tool::Initcheck);
    }

    #[test]
    fn sanitizer_command_lines() {
        let binary = Path::new("target/release/ch07-mlp");
        let chapter = strings(&["--model", "/tmp/1b", "--check", "hi", "4"]);
        let mut plan = plan(&Tool::ALL, None);
        assert_eq!(
            plan.sanitizer_args(Tool::Memcheck, binary, &chapter),
            strings(&[
                "--tool",
                "memcheck",
                "--leak-check",
                "full",
                "--error-exitcode",
                "1",
                "target/release/ch07-mlp",
                "--model",
                "/tmp/1b",
                "--check",
                "hi",
                "4"
            ])
        );
        assert_eq!(
            plan.sanitizer_args(Tool::Racecheck, binary, &chapter)[..3],
            strings(&["--tool", "racecheck", "target/release/ch07-mlp"])
        );
        assert_eq!(plan.sanitizer_args(Tool::Synccheck, binary, &[])[..2], strings(&["--tool", "synccheck"]));
        assert_eq!(plan.sanitizer_args(Tool::Initcheck, binary, &[])[..2], strings(&["--tool", "initcheck"]));
        // --no-leak-check and --sanitizer-option.
        let extra = strings(&["--report-api-errors", "no"]);
        plan.leak_check = false;
        plan.extra_options = &extra;
        assert_eq!(
            plan.sanitizer_args(Tool::Memcheck, binary, &[]),
            strings(&[
                "--tool",
                "memcheck",
                "--error-exitcode",
                "1",
                "--report-api-errors",
                "no",
                "target/release/ch07-mlp"
            ])
        );
    }

    #[test]
    fn sanitizer_is_looked_for_on_path_then_cuda_home_then_usr_local() {
        let found =
            cuda_tool_candidates("compute-sanitizer", Some(OsStr::new("/a/bin::/b")), Some(OsStr::new("/opt/cuda")));
        let expected = ["/a/bin", "/b", "/opt/cuda/bin", "/usr/local/cuda/bin"]
            .map(|dir| PathBuf::from(dir).join("compute-sanitizer"))
            .to_vec();
        assert_eq!(found, expected);
        assert_eq!(
            cuda_tool_candidates("compute-sanitizer", None, Some(OsStr::new(""))),
            vec![PathBuf::from("/usr/local/cuda/bin/compute-sanitizer")]
        );
    }

    const CLEAN_MEMCHECK: &str = "\
========= COMPUTE-SANITIZER
prompt  12 tokens in the chat format; up to 4 new tokens
check: all 4 greedy tokens: 0 of 4 ids differ (limit 0): PASS
========= LEAK SUMMARY: 0 bytes leaked in 0 allocations
========= ERROR SUMMARY: 0 errors
";

    const FAILING_MEMCHECK: &str = "\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 2 bytes
=========     at rms_norm+0x1b0
=========     by thread (31,0,0) in block (5,0,0)
=========     Address 0x7f00001000 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernel [0x2f1e3] in libcuda.so.1
=========
check: something: 1 (limit 0): PASS
========= ERROR SUMMARY: 1 error
";

    fn exit(code: i32) -> Exit {
        Exit { success: code == 0, description: format!("exit status: {code}") }
    }

    #[test]
    fn parses_sanitizer_summaries() {
        let clean = SanitizerReport::parse(CLEAN_MEMCHECK);
        assert_eq!(clean.errors, Some(0));
        assert_eq!(clean.error_count(), Some(0));
        assert_eq!(clean.leaks.as_deref(), Some("0 bytes leaked in 0 allocations"));
        assert!(clean.findings.is_empty(), "{:?}", clean.findings);

        let failing = SanitizerReport::parse(FAILING_MEMCHECK);
        assert_eq!(failing.error_count(), Some(1));
        assert_eq!(
            failing.findings,
            [
                "========= Invalid __global__ read of size 2 bytes",
                "=========     at rms_norm+0x1b0",
                "=========     by thread (31,0,0) in block (5,0,0)",
                "=========     Address 0x7f00001000 is out of bounds",
            ]
        );
        assert_eq!(SanitizerReport::parse("========= ERROR SUMMARY: 27 errors\n").error_count(), Some(27));

        let race = SanitizerReport::parse(
            "========= Error: Race reported between Write access at attention+0x140\n\
             ========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warning)\n",
        );
        assert_eq!((race.hazards, race.error_count()), (Some((2, 1)), Some(2)));
        assert_eq!(race.describe(2), "2 errors, 1 warning");
        let benign = SanitizerReport::parse("========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)");
        assert_eq!(benign.error_count(), Some(0));
        let bare = SanitizerReport::parse("========= RACECHECK SUMMARY: 0 hazards displayed\n");
        assert_eq!(bare.error_count(), Some(0));

        // No summary: the sanitizer did not finish; a program's own lines do not count.
        let missing = SanitizerReport::parse("========= COMPUTE-SANITIZER\nERROR SUMMARY: 0 errors\n");
        assert_eq!(missing.error_count(), None);
        assert_eq!(SanitizerReport::parse("").error_count(), None);
        assert_eq!(SanitizerReport::parse("========= ERROR SUMMARY: lots\n").error_count(), None);

        let leaked = SanitizerReport::parse(
            "========= Leaked 4096 bytes at 0x7f0000\n\
             ========= LEAK SUMMARY: 4096 bytes leaked in 1 allocations\n\
             ========= ERROR SUMMARY: 1 error\n",
        );
        assert_eq!(leaked.describe(1), "1 error (4096 bytes leaked in 1 allocations)");

        let many: String = (0..50).map(|i| format!("========= Invalid __shared__ write {i}\n")).collect();
        assert_eq!(SanitizerReport::parse(&many).findings.len(), super::FINDING_LINES);
    }

    #[test]
    fn sanitizer_rows_tell_the_programs_failure_from_the_sanitizers() {
        let what = "compute-sanitizer memcheck on --check (1B, 4 new tokens)";
        let clean = SanitizerReport::parse(CLEAN_MEMCHECK);
        let row = sanitizer_row("ch07-mlp", what, &clean, &exit(0), &BTreeSet::new());
        assert_eq!(
            (row.chapter.as_str(), row.what.as_str(), row.measured.as_str(), row.limit.as_str(), row.verdict.as_str()),
            ("ch07-mlp", what, "0 errors", "0", "PASS")
        );
        let program_failed = sanitizer_row("ch07-mlp", what, &clean, &exit(1), &BTreeSet::new());
        assert_eq!(program_failed.measured, "0 errors, but the program failed under the sanitizer (exit status: 1)");
        assert_eq!(program_failed.verdict, "FAIL");
        let errors =
            sanitizer_row("ch07-mlp", what, &SanitizerReport::parse(FAILING_MEMCHECK), &exit(1), &BTreeSet::new());
        assert_eq!((errors.measured.as_str(), errors.verdict.as_str()), ("1 error", "FAIL"));
        let missing = sanitizer_row("ch07-mlp", what, &SanitizerReport::parse("killed\n"), &exit(0), &BTreeSet::new());
        assert!(missing.measured.starts_with("no ERROR SUMMARY line"), "{}", missing.measured);
        assert_eq!(missing.verdict, "FAIL");
        let killed = Exit { success: false, description: "signal: 9 (SIGKILL)".into() };
        let row = sanitizer_row(
            "ch07-mlp",
            what,
            &SanitizerReport::parse("========= COMPUTE-SANITIZER\n"),
            &killed,
            &BTreeSet::new(),
        );
        assert_eq!(row.measured, "no ERROR SUMMARY line: the sanitizer did not finish (signal: 9 (SIGKILL))");
        let race = SanitizerReport::parse("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)");
        let row = sanitizer_row("ch06-attention", "racecheck", &race, &exit(0), &BTreeSet::new());
        assert_eq!((row.measured.as_str(), row.verdict.as_str()), ("0 errors, 0 warnings", "PASS"));
    }

    /// Races are counted by kernel: ours fail the row, cuBLAS's are shown but do not.
    #[test]
    fn races_inside_cublas_are_told_apart_from_ours() {
        let ours: BTreeSet<String> = kernel_names(
            "extern \"C\" __global__ void rms_norm(\n int x) {}\nextern \"C\" __global__ void argmax(int y) {}",
        )
        .into_iter()
        .collect();
        assert_eq!(ours, BTreeSet::from(["argmax".to_string(), "rms_norm".to_string()]));
        let cublas = "========= Error: Race reported between Write access at nvjet_sm90_tss_256x8_TNT+0x31c0\n\
                      =========     and Read access at nvjet_sm90_tss_256x8_TNT+0xa10 [1824 hazards]\n\
                      ========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n";
        let row = sanitizer_row("ch07-mlp", "racecheck", &SanitizerReport::parse(cublas), &exit(0), &ours);
        assert_eq!(row.measured, "0 races in our kernels (1 race inside cuBLAS, not ours; 1 error in all)");
        assert_eq!(row.verdict, "PASS");
        let mine = cublas.replace("nvjet_sm90_tss_256x8_TNT", "rms_norm");
        let row = sanitizer_row("ch07-mlp", "racecheck", &SanitizerReport::parse(&mine), &exit(0), &ours);
        assert_eq!((row.measured.as_str(), row.verdict.as_str()), ("1 race in our kernels", "FAIL"));
    }
}
