//! The bench's report: the parts' JSON files merged into `bench.json`, one table of every
//! figure by system (printed, and written as `bench.md` for the book), and two SVG plots.
//!
//! Each part file holds one system's measurements in the shape `shared/bench/src/record.rs`
//! describes; transformers' two modes are two parts, and for each figure the table shows
//! the faster of them, marked with the mode that ran.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use crate::svg;

/// One figure of one part (see `shared/bench/src/record.rs`).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Measurement {
    pub figure: String,
    pub value: f64,
    pub unit: String,
    pub runs: Vec<f64>,
    pub detail: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Part {
    pub system: String,
    pub mode: String,
    pub environment: serde_json::Map<String, serde_json::Value>,
    pub measurements: Vec<Measurement>,
}

impl Part {
    fn get(&self, figure: &str) -> Option<&Measurement> {
        self.measurements.iter().find(|m| m.figure == figure)
    }

    fn env_f64(&self, key: &str) -> Option<f64> {
        self.environment.get(key)?.as_f64()
    }
}

/// One kernel's share of a decode step, from Nsight Compute.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub launches: usize,
    /// Summed over every launch of the profiled steps.
    pub total_us: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Profile {
    pub system: String,
    pub steps: usize,
    /// Sequences per decode step.
    #[serde(default = "one")]
    pub batch: usize,
    pub kernels: Vec<Kernel>,
}

fn one() -> usize {
    1
}

/// Where and when: written when a run starts, read back by the report.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Meta {
    pub date: String,
    pub commit: String,
    pub driver: String,
    pub config: String,
    pub model: String,
    pub seed: u64,
}

impl Meta {
    pub fn now(commit: String, driver: String, config: String, model: String, seed: u64) -> Self {
        Meta { date: utc_now(), commit, driver, config, model, seed }
    }

    pub fn write(&self, dir: &Path) -> Result<()> {
        Ok(std::fs::write(dir.join("meta.json"), serde_json::to_string_pretty(self)? + "\n")?)
    }
}

/// The merged report.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Report {
    pub meta: Meta,
    pub gpu: String,
    pub parts: Vec<Part>,
    pub profiles: Vec<Profile>,
}

pub fn read(file: &Path) -> Result<Report> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a bench report", file.display()))
}

/// Merges the parts in `dir` into `bench.json`, prints the table, and writes it and the
/// plots beside it (see [`outputs`]).
pub fn report(dir: &Path) -> Result<()> {
    let meta: Meta = serde_json::from_str(
        &std::fs::read_to_string(dir.join("meta.json"))
            .with_context(|| format!("no meta.json in {}", dir.display()))?,
    )?;
    let mut parts = Vec::new();
    let mut profiles = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    for file in files {
        let name = file.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let not_a_part =
            ["bench.json", "meta.json", "workloads.json"].contains(&name.as_str()) || name.starts_with("timeline-");
        if !name.ends_with(".json") || not_a_part {
            continue;
        }
        let text = std::fs::read_to_string(&file)?;
        if name.starts_with("profile-") {
            profiles.push(serde_json::from_str(&text).with_context(|| format!("{name} is not a profile"))?);
        } else {
            parts.push(serde_json::from_str(&text).with_context(|| format!("{name} is not a bench part"))?);
        }
    }
    ensure!(!parts.is_empty(), "no parts to report in {}", dir.display());
    let gpu = parts
        .iter()
        .find_map(|p: &Part| p.environment.get("gpu")?.as_str().map(str::to_string))
        .unwrap_or_else(|| "unknown GPU".into());
    let report = Report { meta, gpu, parts, profiles };
    let json = dir.join("bench.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)? + "\n")?;
    println!();
    println!("{}", markdown(&report));
    write_outputs(&report, &json)?;
    println!("bench: report in {}", json.display());
    Ok(())
}

/// Whether less or more of a figure is better.
#[derive(Clone, Copy, PartialEq)]
enum Better {
    Lower,
    Higher,
}

/// The table's rows: figure, label, which way is better.
const ROWS: [(&str, &str, Better); 32] = [
    ("decode_step_ms", "decode step, batch 1 (ms)", Better::Lower),
    ("decode_tokens_per_s", "decode, batch 1 (tokens/s)", Better::Higher),
    ("ttft_ms", "time to first token, 32-token prompt (ms)", Better::Lower),
    ("decode_step_ms_whole", "decode step, batch 1, no flash-decoding (ms)", Better::Lower),
    ("decode_step_ms_long_split", "decode step, batch 1, at positions 2,016–2,047 (ms)", Better::Lower),
    (
        "decode_step_ms_long_whole",
        "decode step, batch 1, at positions 2,016–2,047, no flash-decoding (ms)",
        Better::Lower,
    ),
    ("decode_step_ms_batch_8", "decode step, batch 8 (ms)", Better::Lower),
    ("decode_step_ms_batch_32", "decode step, batch 32 (ms)", Better::Lower),
    ("decode_step_ms_batch_128", "decode step, batch 128 (ms)", Better::Lower),
    ("decode_step_ms_batch_256", "decode step, batch 256 (ms)", Better::Lower),
    ("throughput_concurrent_8", "throughput, 8 requests (tokens/s)", Better::Higher),
    ("throughput_concurrent_32", "throughput, 32 requests (tokens/s)", Better::Higher),
    ("throughput_concurrent_128", "throughput, 128 requests (tokens/s)", Better::Higher),
    ("throughput_concurrent_256", "throughput, 256 requests (tokens/s)", Better::Higher),
    ("throughput_mixed", "throughput, mixed 64 requests (tokens/s)", Better::Higher),
    ("throughput_mixed_static", "throughput, mixed 64 requests, static batching (tokens/s)", Better::Higher),
    ("throughput_mixed_pool_128mib", "throughput, mixed 64 requests, 128 MiB KV cache (tokens/s)", Better::Higher),
    (
        "admission_throughput_conservative_32mib",
        "throughput, 64 early-stopping requests, conservative admission, 32 MiB KV cache (tokens/s)",
        Better::Higher,
    ),
    (
        "admission_throughput_optimistic_32mib",
        "throughput, 64 early-stopping requests, optimistic admission, 32 MiB KV cache (tokens/s)",
        Better::Higher,
    ),
    (
        "admission_preemptions_optimistic_32mib",
        "preemptions, 64 early-stopping requests, optimistic admission, 32 MiB KV cache",
        Better::Lower,
    ),
    (
        "admission_recomputed_tokens_optimistic_32mib",
        "recomputed tokens, 64 early-stopping requests, optimistic admission, 32 MiB KV cache",
        Better::Lower,
    ),
    (
        "admission_throughput_conservative_128mib",
        "throughput, 64 early-stopping requests, conservative admission, 128 MiB KV cache (tokens/s)",
        Better::Higher,
    ),
    (
        "admission_throughput_optimistic_128mib",
        "throughput, 64 early-stopping requests, optimistic admission, 128 MiB KV cache (tokens/s)",
        Better::Higher,
    ),
    (
        "admission_preemptions_optimistic_128mib",
        "preemptions, 64 early-stopping requests, optimistic admission, 128 MiB KV cache",
        Better::Lower,
    ),
    (
        "admission_recomputed_tokens_optimistic_128mib",
        "recomputed tokens, 64 early-stopping requests, optimistic admission, 128 MiB KV cache",
        Better::Lower,
    ),
    ("prefill_ms", "prefill, 2,047-token prompt (ms)", Better::Lower),
    ("prefill_tokens_per_s", "prefill (tokens/s)", Better::Higher),
    ("load_s", "weight load, file to GPU (s)", Better::Lower),
    ("load_gb_per_s", "weight load (GB/s)", Better::Higher),
    ("peak_memory_gib", "peak GPU memory (GiB)", Better::Lower),
    ("read_bandwidth_tb_per_s", "streaming read bandwidth (TB/s)", Better::Higher),
    ("gemm_tflops", "cuBLAS bf16 GEMM 8192³ (TFLOP/s)", Better::Higher),
];

/// A figure as one system reached it: the value and, for transformers, the mode that ran.
struct Cell {
    value: f64,
    mode: Option<String>,
}

/// The table's columns: our chapters in order, then transformers (the faster mode per
/// figure), then the GEMV chain, then the ceilings.
fn columns(report: &Report) -> Vec<String> {
    let mut systems: Vec<String> = report.parts.iter().map(|p| p.system.clone()).collect();
    systems.sort_by_key(|s| (column_rank(s), s.clone()));
    systems.dedup();
    systems
}

fn column_rank(system: &str) -> u8 {
    match system {
        s if s.starts_with("ch") => 0,
        "transformers" => 1,
        "torch-gemv-graph" => 2,
        _ => 3,
    }
}

fn cell(report: &Report, system: &str, figure: &str, better: Better) -> Option<Cell> {
    let candidates = report.parts.iter().filter(|p| p.system == system).filter_map(|p| Some((p, p.get(figure)?)));
    let best = candidates.filter(|(_, m)| m.value.is_finite()).reduce(|a, b| {
        let b_better = match better {
            Better::Lower => b.1.value < a.1.value,
            Better::Higher => b.1.value > a.1.value,
        };
        if b_better { b } else { a }
    })?;
    let mode = (!best.0.mode.is_empty()).then(|| best.0.mode.clone());
    Some(Cell { value: best.1.value, mode })
}

/// The hardware's limit for a figure where one follows from the ceilings: a decode step
/// cannot take less than reading every weight once at the measured bandwidth, a prefill
/// less than its matrix work at cuBLAS's GEMM rate.
fn limit(report: &Report, figure: &str) -> Option<f64> {
    let ceilings = report.parts.iter().find(|p| p.system == "ceilings")?;
    let chapter =
        report.parts.iter().find(|p| p.system.starts_with("ch") && p.env_f64("decode_read_bytes").is_some())?;
    let bandwidth = ceilings.get("read_bandwidth_tb_per_s")?.value * 1e12;
    let flops_rate = ceilings.get("gemm_tflops")?.value * 1e12;
    let step_s = chapter.env_f64("decode_read_bytes")? / bandwidth;
    let prefill_tokens = 2047.0;
    // Two FLOPs per weight per token, and attention's two products over the causal half.
    let layers = chapter.env_f64("layers")?;
    let attention = 2.0 * 2.0 * layers * chapter.env_f64("q_width")? * prefill_tokens * prefill_tokens / 2.0;
    let prefill_s = (2.0 * chapter.env_f64("layer_params")? * prefill_tokens + attention) / flops_rate;
    match figure {
        "decode_step_ms" => Some(step_s * 1e3),
        // Batched or not, a step reads every weight once (the KV cache's reads come on top).
        f if f.starts_with("decode_step_ms_batch_") => Some(step_s * 1e3),
        "decode_tokens_per_s" => Some(1.0 / step_s),
        "prefill_ms" => Some(prefill_s * 1e3),
        "prefill_tokens_per_s" => Some(prefill_tokens / prefill_s),
        _ => None,
    }
}

/// A value with as many digits as it deserves.
fn format_value(value: f64) -> String {
    match value.abs() {
        v if v >= 1000.0 => {
            let whole = format!("{:.0}", value);
            let digits: Vec<char> = whole.chars().collect();
            let mut grouped = String::new();
            for (i, c) in digits.iter().enumerate() {
                if i > 0 && (digits.len() - i).is_multiple_of(3) {
                    grouped.push(',');
                }
                grouped.push(*c);
            }
            grouped
        }
        v if v >= 100.0 => format!("{value:.0}"),
        v if v >= 10.0 => format!("{value:.1}"),
        v if v >= 1.0 => format!("{value:.2}"),
        _ => format!("{value:.3}"),
    }
}

/// A system's name in a plot's legend: transformers' line joins its faster mode at each point.
fn display_name(system: &str) -> String {
    if system == "transformers" { "transformers (faster mode)".into() } else { system.into() }
}

fn short_mode(mode: &str) -> &str {
    if mode.starts_with("static cache") { "compiled" } else { mode }
}

/// Short names of transformers' modes, for the table's cells.
fn mode_mark(mode: &str) -> &'static str {
    if mode.starts_with("static cache") {
        "c"
    } else if mode == "eager" {
        "e"
    } else {
        ""
    }
}

/// The report as Markdown: what ran where, the table, the ratios, and per-kernel times.
pub fn markdown(report: &Report) -> String {
    let meta = &report.meta;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} · driver {} · {} · commit {} · {}\n",
        report.gpu,
        meta.driver,
        meta.model,
        &meta.commit[..meta.commit.len().min(12)],
        meta.date
    );
    let systems = columns(report);
    let latest = systems.iter().rfind(|s| s.starts_with("ch")).cloned();
    let data_columns: Vec<&String> = systems.iter().filter(|s| *s != "ceilings").collect();
    let mut header = String::from("| figure |");
    let mut rule = String::from("|---|");
    for system in &data_columns {
        let _ = write!(header, " {system} |");
        rule.push_str("---:|");
    }
    header.push_str(" limit |");
    rule.push_str("---:|");
    if let Some(latest) = &latest {
        let _ = write!(header, " {latest} vs transformers |");
        rule.push_str("---:|");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    let mut used_modes = BTreeMap::new();
    for (figure, label, better) in ROWS {
        let is_ceiling = figure == "read_bandwidth_tb_per_s" || figure == "gemm_tflops";
        let mut line = format!("| {label} |");
        let mut any = false;
        for system in &data_columns {
            match cell(report, system, figure, better) {
                Some(c) => {
                    any = true;
                    let mark = c.mode.as_deref().map(mode_mark).unwrap_or("");
                    if !mark.is_empty() {
                        used_modes.insert(mark, c.mode.clone().unwrap_or_default());
                        let _ = write!(line, " {} ({mark}) |", format_value(c.value));
                    } else {
                        let _ = write!(line, " {} |", format_value(c.value));
                    }
                }
                None => line.push_str(" — |"),
            }
        }
        let limit =
            if is_ceiling { cell(report, "ceilings", figure, better).map(|c| c.value) } else { limit(report, figure) };
        any |= limit.is_some();
        match limit {
            Some(v) => {
                let _ = write!(line, " {} |", format_value(v));
            }
            None => line.push_str(" — |"),
        }
        if let Some(latest) = &latest {
            let ours = cell(report, latest, figure, better);
            let theirs = cell(report, "transformers", figure, better);
            match (ours, theirs) {
                (Some(o), Some(t)) if figure != "peak_memory_gib" => {
                    let speedup = match better {
                        Better::Lower => t.value / o.value,
                        Better::Higher => o.value / t.value,
                    };
                    let _ = write!(line, " {speedup:.2}× |");
                }
                (Some(o), Some(t)) => {
                    let _ = write!(line, " {:.2}× the memory |", o.value / t.value);
                }
                _ => line.push_str(" — |"),
            }
        }
        if any {
            let _ = writeln!(out, "{line}");
        }
    }
    let _ = writeln!(out);
    for (mark, mode) in &used_modes {
        let _ = writeln!(out, "({mark}) transformers {mode}.  ");
    }
    let _ = writeln!(
        out,
        "Each figure is the median of several runs after a warm-up. \"vs transformers\" is how many \
         times faster (or, for memory, how much); the limit of a decode step is reading every weight \
         once at the measured bandwidth, of a prefill its matrix products at the measured GEMM rate."
    );
    for profile in &report.profiles {
        out.push('\n');
        out.push_str(&profile_table(report, profile));
    }
    out
}

/// Per-kernel time of one decode step, largest first, against the step's measured time.
fn profile_table(report: &Report, profile: &Profile) -> String {
    let mut out = String::new();
    let steps = profile.steps.max(1) as f64;
    let total: f64 = profile.kernels.iter().map(|k| k.total_us).sum::<f64>() / steps;
    let _ = writeln!(
        out,
        "Kernels of one decode step of {}, batch {} (Nsight Compute, {} steps):\n",
        profile.system, profile.batch, profile.steps
    );
    let _ = writeln!(out, "| kernel | launches per step | µs per step | share |\n|---|---:|---:|---:|");
    let mut kernels = profile.kernels.clone();
    kernels.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
    for kernel in &kernels {
        let per_step = kernel.total_us / steps;
        let _ = writeln!(
            out,
            "| `{}` | {} | {:.1} | {:.1}% |",
            kernel.name,
            per_step_count(kernel.launches, steps),
            per_step,
            100.0 * per_step / total
        );
    }
    let _ = write!(
        out,
        "| all kernels | {} | {:.1} | 100% |",
        per_step_count(kernels.iter().map(|k| k.launches).sum(), steps),
        total
    );
    let figure = if profile.batch == 1 {
        "decode_step_ms".to_string()
    } else {
        format!("decode_step_ms_batch_{}", profile.batch)
    };
    let measured = cell(report, &profile.system, &figure, Better::Lower);
    if let Some(step) = measured {
        let _ = write!(
            out,
            "\n\nThe kernels take {:.0} µs of the measured {:.0} µs step; the other {:.0} µs are the gaps \
             between them: launches, and the host waiting for each token.\n",
            total,
            step.value * 1e3,
            step.value * 1e3 - total
        );
    } else {
        out.push('\n');
    }
    out
}

/// Launches per step: whole when every step launched the same kernels.
fn per_step_count(launches: usize, steps: f64) -> String {
    let count = launches as f64 / steps;
    if count.fract() == 0.0 { format!("{count:.0}") } else { format!("{count:.1}") }
}

/// Nsight Compute's CSV (`--csv --print-units base`, metric `gpu__time_duration.sum`) →
/// each kernel's launches and summed time.
pub fn parse_ncu_csv(text: &str) -> Result<Vec<Kernel>> {
    let mut lines = text.lines().filter(|line| line.starts_with('"'));
    let header = split_csv(
        lines.next().context("ncu wrote no CSV (did any kernel run between the profiler's start and stop?)")?,
    );
    let column =
        |name: &str| header.iter().position(|h| h == name).with_context(|| format!("ncu's CSV has no {name:?} column"));
    let (name_col, metric_col, unit_col, value_col) =
        (column("Kernel Name")?, column("Metric Name")?, column("Metric Unit")?, column("Metric Value")?);
    let mut kernels: Vec<Kernel> = Vec::new();
    for line in lines {
        let fields = split_csv(line);
        if fields.get(metric_col).map(String::as_str) != Some("gpu__time_duration.sum") {
            continue;
        }
        let value: f64 =
            fields[value_col].replace(',', "").parse().with_context(|| format!("bad ncu value in {line}"))?;
        let us = match fields[unit_col].as_str() {
            "nsecond" | "ns" => value / 1e3,
            "usecond" | "us" => value,
            "msecond" | "ms" => value * 1e3,
            "second" | "s" => value * 1e6,
            other => anyhow::bail!("unknown ncu time unit {other:?}"),
        };
        let name = fields[name_col].clone();
        match kernels.iter_mut().find(|k| k.name == name) {
            Some(kernel) => {
                kernel.launches += 1;
                kernel.total_us += us;
            }
            None => kernels.push(Kernel { name, launches: 1, total_us: us }),
        }
    }
    ensure!(!kernels.is_empty(), "ncu's CSV holds no kernel times");
    Ok(kernels)
}

/// One line of quoted CSV fields: `"a","b,c"` → `a`, `b,c`.
fn split_csv(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

/// What a report turns into beside its JSON file `NAME.json`: the table `NAME.md` and the
/// two plots `NAME-throughput.svg` (tokens/s against concurrency) and
/// `NAME-decode-step.svg` (the batch-1 decode step of each system against the floor).
pub fn outputs(report: &Report) -> Vec<(&'static str, String)> {
    let mut outputs = vec![
        (".md", markdown(report)),
        ("-throughput.svg", throughput_plot(report)),
        ("-decode-step.svg", step_plot(report)),
    ];
    if let Some(plot) = batch_plot(report) {
        outputs.push(("-batch.svg", plot));
    }
    outputs
}

/// Writes [`outputs`] beside `json`.
pub fn write_outputs(report: &Report, json: &Path) -> Result<()> {
    let stem = json.file_stem().context("the report's file has no name")?.to_string_lossy().into_owned();
    let dir = json.parent().unwrap_or(Path::new("."));
    for (suffix, text) in outputs(report) {
        let path = dir.join(format!("{stem}{suffix}"));
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("bench: wrote {}", path.display());
    }
    Ok(())
}

fn subtitle(report: &Report) -> String {
    format!("{} · {} · {}", report.gpu, report.meta.model, &report.meta.date[..10.min(report.meta.date.len())])
}

fn throughput_plot(report: &Report) -> String {
    let mut series = Vec::new();
    for system in columns(report).iter().filter(|s| s.starts_with("ch") || *s == "transformers") {
        let mut points = Vec::new();
        if let Some(c) = cell(report, system, "decode_tokens_per_s", Better::Higher) {
            points.push((1.0, c.value));
        }
        for n in [8, 32, 128, 256] {
            if let Some(c) = cell(report, system, &format!("throughput_concurrent_{n}"), Better::Higher) {
                points.push((n as f64, c.value));
            }
        }
        if !points.is_empty() {
            series.push(svg::Series { name: display_name(system), points });
        }
    }
    svg::line_chart(&svg::LineChart {
        title: "Generated tokens per second against concurrent requests",
        subtitle: &subtitle(report),
        x_label: "concurrent requests (1 = single-sequence decode)",
        y_label: "tokens/s",
        series,
    })
}

/// The decode step against its batch, for the systems that measured more than one batch
/// size, beside the floor: where a step stops being bound by reading the weights.
fn batch_plot(report: &Report) -> Option<String> {
    let figure =
        |batch: usize| if batch == 1 { "decode_step_ms".to_string() } else { format!("decode_step_ms_batch_{batch}") };
    let mut series = Vec::new();
    for system in columns(report).iter().filter(|s| *s != "ceilings") {
        let points: Vec<(f64, f64)> = [1, 8, 32, 128, 256]
            .into_iter()
            .filter_map(|b| cell(report, system, &figure(b), Better::Lower).map(|c| (b as f64, c.value)))
            .collect();
        if points.len() > 1 {
            series.push(svg::Series { name: system.clone(), points });
        }
    }
    let floor = limit(report, "decode_step_ms")?;
    if series.is_empty() {
        return None;
    }
    series.push(svg::Series { name: "floor: weights read once".into(), points: vec![(1.0, floor), (256.0, floor)] });
    Some(svg::line_chart(&svg::LineChart {
        title: "One decode step against its batch",
        subtitle: &subtitle(report),
        x_label: "sequences per decode step",
        y_label: "ms per step",
        series,
    }))
}

fn step_plot(report: &Report) -> String {
    let mut bars = Vec::new();
    for system in columns(report).iter().filter(|s| *s != "ceilings") {
        if let Some(c) = cell(report, system, "decode_step_ms", Better::Lower) {
            let name = match c.mode.as_deref() {
                Some(mode) if system == "transformers" => format!("transformers, {}", short_mode(mode)),
                _ => system.clone(),
            };
            bars.push((name, c.value));
        }
    }
    let floor = limit(report, "decode_step_ms");
    svg::bar_chart(&svg::BarChart {
        title: "One decode step at batch 1, against the floor",
        subtitle: &subtitle(report),
        unit: "ms",
        bars,
        reference: floor.map(|f| ("floor: every weight read once".to_string(), f)),
    })
}

/// A chapter's `--timeline` file: which request held which slot over which decode steps.
#[derive(Deserialize)]
struct TimelineFile {
    policy: String,
    slots: usize,
    steps: usize,
    occupancy: Vec<Occupancy>,
}

#[derive(Deserialize)]
struct Occupancy {
    request: usize,
    slot: usize,
    from_step: usize,
    to_step: usize,
}

/// Draws a `--timeline` file as an SVG beside it (same name, `.svg`).
pub fn draw_timeline(file: &Path) -> Result<()> {
    let svg = timeline_svg(file)?;
    let out = file.with_extension("svg");
    std::fs::write(&out, svg).with_context(|| format!("cannot write {}", out.display()))?;
    println!("bench: timeline drawn in {}", out.display());
    Ok(())
}

/// A `--timeline` file's picture: a row per slot, a bar per request's stay.
fn timeline_svg(file: &Path) -> Result<String> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let timeline: TimelineFile =
        serde_json::from_str(&text).with_context(|| format!("{} is not a --timeline file", file.display()))?;
    let stays = timeline
        .occupancy
        .iter()
        .map(|o| svg::Stay {
            label: o.request.to_string(),
            colour: o.request,
            row: o.slot,
            from: o.from_step as f64,
            to: o.to_step as f64,
        })
        .collect();
    let subtitle = format!(
        "{} requests, {} batching in {} slots: {} decode steps",
        timeline.occupancy.len(),
        timeline.policy,
        timeline.slots,
        timeline.steps
    );
    Ok(svg::timeline_chart(&svg::Timeline {
        title: "Which request holds which slot, step by step",
        subtitle: &subtitle,
        row_name: "slot",
        rows: timeline.slots,
        x_label: "decode step",
        end: timeline.steps as f64,
        stays,
    }))
}

/// The current time in UTC, `2026-12-01T17:03:00Z`, from the system clock.
fn utc_now() -> String {
    let seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Days since 1970-01-01 → (year, month, day), Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(system: &str, mode: &str, figures: &[(&str, f64)], env: &[(&str, f64)]) -> Part {
        Part {
            system: system.into(),
            mode: mode.into(),
            environment: env.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect(),
            measurements: figures
                .iter()
                .map(|(f, v)| Measurement {
                    figure: f.to_string(),
                    value: *v,
                    unit: String::new(),
                    runs: vec![*v],
                    detail: String::new(),
                })
                .collect(),
        }
    }

    fn sample() -> Report {
        let meta = Meta::now("abcdef0123456789".into(), "580.1".into(), "1b".into(), "synthetic 1b, seed 1".into(), 1);
        let env = [("decode_read_bytes", 2.4e9), ("layer_params", 9.7e8), ("layers", 16.0), ("q_width", 2048.0)];
        Report {
            meta,
            gpu: "NVIDIA H200".into(),
            parts: vec![
                part("ceilings", "", &[("read_bandwidth_tb_per_s", 4.0), ("gemm_tflops", 600.0)], &[]),
                part(
                    "ch08-kv-cache",
                    "",
                    &[("decode_step_ms", 2.0), ("decode_tokens_per_s", 500.0), ("peak_memory_gib", 3.0)],
                    &env,
                ),
                part(
                    "transformers",
                    "eager",
                    &[("decode_step_ms", 40.0), ("decode_tokens_per_s", 25.0), ("peak_memory_gib", 2.5)],
                    &[],
                ),
                part(
                    "transformers",
                    "static cache + torch.compile",
                    &[("decode_step_ms", 10.0), ("decode_tokens_per_s", 100.0)],
                    &[],
                ),
            ],
            profiles: vec![Profile {
                system: "ch08-kv-cache".into(),
                steps: 2,
                batch: 1,
                kernels: vec![Kernel { name: "rms_norm".into(), launches: 66, total_us: 400.0 }],
            }],
        }
    }

    #[test]
    fn the_table_takes_transformers_faster_mode_and_says_which() {
        let table = markdown(&sample());
        // 40 ms eager, 10 ms compiled: the compiled one is shown, marked, and the ratio uses it.
        let step = table.lines().find(|l| l.starts_with("| decode step, batch 1")).unwrap();
        assert_eq!(step, "| decode step, batch 1 (ms) | 2.00 | 10.0 (c) | 0.600 | 5.00× |");
        let rate = table.lines().find(|l| l.starts_with("| decode, batch 1")).unwrap();
        assert!(rate.ends_with("| 500 | 100 (c) | 1,667 | 5.00× |"), "{rate}");
        assert!(table.contains("(c) transformers static cache + torch.compile"));
        // Rows nobody measured are left out; memory is a ratio of sizes, not a speed-up.
        assert!(!table.contains("256 requests"));
        assert!(table.contains("| peak GPU memory (GiB) | 3.00 | 2.50 (e) | — | 1.20× the memory |"));
    }

    #[test]
    fn a_later_chapter_is_a_column_of_its_own_and_the_one_compared() {
        let mut report = sample();
        let figures = [("decode_step_ms", 1.5), ("decode_step_ms_long_whole", 3.0), ("throughput_concurrent_8", 900.0)];
        report.parts.push(part("ch10-paged-attention", "", &figures, &[]));
        let table = markdown(&report);
        let row = |start: &str| table.lines().find(|l| l.starts_with(start)).unwrap_or_default();
        let header = "| figure | ch08-kv-cache | ch10-paged-attention | transformers | limit | ch10-paged-attention vs";
        assert!(row("| figure |").starts_with(header), "{table}");
        assert_eq!(
            row("| decode step, batch 1 (ms)"),
            "| decode step, batch 1 (ms) | 2.00 | 1.50 | 10.0 (c) | 0.600 | 6.67× |"
        );
        // A figure only the later chapter measures is a row, empty elsewhere; one nobody
        // measured is none.
        let long = row("| decode step, batch 1, at positions 2,016–2,047, no flash-decoding (ms)");
        assert!(long.ends_with("| — | 3.00 | — | — | — |"), "{table}");
        assert!(row("| decode step, batch 1, at positions 2,016–2,047 (ms)").is_empty(), "{table}");
        assert!(throughput_plot(&report).contains("ch10-paged-attention"));
    }

    #[test]
    fn the_profile_table_sums_per_step_and_names_the_gap() {
        let table = markdown(&sample());
        assert!(table.contains("| `rms_norm` | 33 | 200.0 | 100.0% |"), "{table}");
        assert!(table.contains("The kernels take 200 µs of the measured 2000 µs step; the other 1800 µs"));
    }

    #[test]
    fn ncu_csv_becomes_kernels() {
        let csv = "==PROF== Connected to process\n\
            \"ID\",\"Process ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n\
            \"0\",\"1\",\"rms_norm\",\"gpu__time_duration.sum\",\"nsecond\",\"2,048\"\n\
            \"1\",\"1\",\"gemv2T_kernel_val\",\"gpu__time_duration.sum\",\"nsecond\",\"10000\"\n\
            \"2\",\"1\",\"rms_norm\",\"gpu__time_duration.sum\",\"usecond\",\"1.5\"\n";
        let kernels = parse_ncu_csv(csv).unwrap();
        assert_eq!(kernels[0], Kernel { name: "rms_norm".into(), launches: 2, total_us: 3.548 });
        assert_eq!(kernels[1], Kernel { name: "gemv2T_kernel_val".into(), launches: 1, total_us: 10.0 });
        assert!(parse_ncu_csv("==PROF== no kernels\n").is_err());
    }

    #[test]
    fn values_are_grouped_and_rounded() {
        assert_eq!(format_value(12345.6), "12,346");
        assert_eq!(format_value(999.4), "999");
        assert_eq!(format_value(1.914), "1.91");
        assert_eq!(format_value(0.5812), "0.581");
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    #[test]
    fn outputs_are_written_beside_the_report() {
        let dir = tempfile::tempdir().unwrap();
        write_outputs(&sample(), &dir.path().join("run.json")).unwrap();
        let throughput = std::fs::read_to_string(dir.path().join("run-throughput.svg")).unwrap();
        assert!(throughput.starts_with("<svg") && throughput.contains("ch08-kv-cache"));
        assert!(throughput.contains("transformers (faster mode)"));
        let steps = std::fs::read_to_string(dir.path().join("run-decode-step.svg")).unwrap();
        assert!(steps.contains("floor: every weight read once") && steps.contains("transformers, compiled"));
        assert!(std::fs::read_to_string(dir.path().join("run.md")).unwrap().contains("| decode step, batch 1 (ms) |"));
    }

    /// The book shows the committed runs' tables and plots: they must be what their JSON gives.
    #[test]
    fn the_books_tables_and_plots_match_their_runs() {
        let perf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../book/src/perf");
        let mut runs = 0;
        for entry in std::fs::read_dir(&perf).unwrap() {
            let json = entry.unwrap().path();
            if json.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let stem = json.file_stem().unwrap().to_string_lossy().into_owned();
            if stem.starts_with("timeline-") {
                let committed = std::fs::read_to_string(json.with_extension("svg")).unwrap_or_default();
                assert!(committed == timeline_svg(&json).unwrap(), "{stem}.svg is stale: cargo x bench --timeline");
                continue;
            }
            runs += 1;
            for (suffix, text) in outputs(&read(&json).unwrap()) {
                let committed = std::fs::read_to_string(perf.join(format!("{stem}{suffix}"))).unwrap_or_default();
                assert!(
                    committed == text,
                    "book/src/perf/{stem}{suffix} is stale: cargo x bench --plot {}",
                    json.display()
                );
            }
        }
        assert!(runs > 0, "no runs in {}", perf.display());
    }

    #[test]
    fn a_folder_without_a_run_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let error = report(dir.path()).unwrap_err().to_string();
        assert!(error.contains("no meta.json in"), "{error}");
    }
}
