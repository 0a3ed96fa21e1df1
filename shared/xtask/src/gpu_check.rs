//! `cargo x gpu-check`: every chapter's `--check` on a synthetic Llama 3.2 1B checkpoint,
//! summarised in one table. Run it on a machine with an NVIDIA GPU.
//!
//! Each chapter binary prints its verdicts as lines of the form
//! `check: WHAT: MEASURED (limit LIMIT): PASS` and exits non-zero
//! when any of them fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use llama_reference::synth::{SynthConfig, write_checkpoint};

use crate::paths;

#[derive(clap::Args)]
pub struct Args {
    /// Folder holding the chapter binaries (ch01-weights, …).
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Use this model directory instead of writing a synthetic 1B checkpoint.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Where to write the synthetic checkpoint.
    #[arg(long, default_value = "/tmp/gpu-check-1b")]
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
    let seed = args.seed.unwrap_or_else(time_seed);
    let model = match &args.model {
        Some(dir) => dir.clone(),
        None => synthetic_model(&args.work_dir, seed)?,
    };
    let prompt = random_prompt(seed);
    println!("gpu-check: prompt {prompt:?}");
    let mut rows = Vec::new();
    let chosen = |folder: &str| args.only.is_empty() || args.only.iter().any(|nn| folder.starts_with(nn.as_str()));
    for (folder, _) in paths::chapters()?.into_iter().filter(|(folder, _)| chosen(folder)) {
        let name = paths::package_name(&folder);
        let binary = args.bin_dir.join(&name);
        if !binary.exists() {
            rows.push(Row::note(&name, &format!("no binary in {}", args.bin_dir.display()), "SKIPPED"));
            continue;
        }
        // Chapter 1 has no tokenizer; from chapter 2 on every binary takes a prompt.
        let mut chapter_args = vec!["--model".into(), model.display().to_string(), "--check".into()];
        if folder.as_str() >= "02" {
            if let Some(tokenizer) = &args.tokenizer {
                chapter_args.extend(["--tokenizer".into(), tokenizer.display().to_string()]);
            }
            chapter_args.push(prompt.clone());
        }
        rows.extend(run_chapter(&name, &binary, &chapter_args)?);
        // Attention must handle the whole context: chapter 6 is checked on a ~2,000-token prompt too.
        if folder.starts_with("06") {
            let last = chapter_args.len() - 1;
            chapter_args[last] = "The quick brown fox jumps over the lazy dog. ".repeat(200);
            let long = run_chapter(&name, &binary, &chapter_args)?;
            rows.extend(long.into_iter().map(|row| Row { what: format!("{} [~2,010-token prompt]", row.what), ..row }));
        }
    }
    let engine = latest_generating_chapter(&args.bin_dir)?;
    let engine_chosen = |e: &PathBuf| e.file_name().and_then(|n| n.to_str()?.strip_prefix("ch")).is_some_and(chosen);
    if let Some(engine) = engine.filter(engine_chosen) {
        let prompts = [prompt.clone(), "Say hello.".to_string(), "Tell me about it.".to_string()];
        if !args.no_agreement {
            rows.extend(transformers_agreement(&engine, &model, args.tokenizer.as_deref(), &prompts)?);
        }
        if !args.no_drift {
            rows.extend(drift_ratios(&engine, &args.drift_dir, args.tokenizer.as_deref())?);
        }
    }
    print_table(&rows, &model, seed, &prompt, args.model.is_some());
    let failed = rows.iter().filter(|r| r.verdict == "FAIL").count();
    if failed > 0 {
        bail!("{failed} check(s) failed");
    }
    Ok(())
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

fn synthetic_model(dir: &Path, seed: u64) -> Result<PathBuf> {
    println!("gpu-check: writing a synthetic 1B checkpoint (seed {seed}) to {}", dir.display());
    let start = std::time::Instant::now();
    write_checkpoint(SynthConfig::OneB, seed, dir)?;
    println!("gpu-check: written in {:.1} s", start.elapsed().as_secs_f64());
    Ok(dir.to_path_buf())
}

/// The binary of the last chapter present that generates text (chapter 7 on).
fn latest_generating_chapter(bin_dir: &Path) -> Result<Option<PathBuf>> {
    let generating = paths::chapters()?.into_iter().filter(|(folder, _)| folder.as_str() >= "07");
    Ok(generating.map(|(folder, _)| bin_dir.join(paths::package_name(&folder))).rfind(|b| b.exists()))
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
        let generated = run.lines().find_map(|line| line.strip_prefix("generated ids: ")).unwrap_or_default();
        ours.push(parse_ids(generated)?);
    }
    let script = paths::root().join("shared/reference/python/hf_greedy.py");
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
                let script = paths::root().join("shared/reference/python/hf_random_model.py");
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
            .find(|r| r.what.starts_with("logits of the prompt's last position"))
            .and_then(Row::relative_error);
        rows.extend(checked.into_iter().map(|row| Row { what: format!("{} [{}]", row.what, model.name()), ..row }));
        let script = paths::root().join("shared/reference/python/hf_bf16_drift.py");
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

fn print_table(rows: &[Row], model: &Path, seed: u64, prompt: &str, given_model: bool) {
    println!();
    let source = if given_model { format!("{}", model.display()) } else { format!("synthetic 1B, seed {seed}") };
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
    use super::Row;

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
}
