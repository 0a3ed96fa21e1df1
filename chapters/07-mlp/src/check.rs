//! The verdicts of `--check`, in one line format that `cargo x gpu-check` reads:
//!
//! ```text
//! check: WHAT: MEASURED (limit LIMIT): PASS
//! ```
//!
//! WHAT names the comparison, MEASURED says what was found, LIMIT what is allowed; the
//! verdict is PASS or FAIL. Every comparison runs and prints before the program fails, so
//! one run shows every result. From this chapter on, most comparisons are between what
//! the GPU computed and the CPU reference (`llama-reference`).

use anyhow::{Result, bail};
use half::bf16;
use llama_reference::{LayerCache, Matrix, Model};

use crate::model::{ATTENTION_ROUNDINGS, MLP_ROUNDINGS};

// ANCHOR: measure
/// How far a GPU result is from the reference.
pub struct Error {
    /// The largest absolute difference.
    pub max_abs: f32,
    /// `max_abs` divided by the largest reference magnitude.
    pub relative: f32,
    pub nan_count: usize,
}

pub fn measure(gpu: &[f32], reference: &[f32]) -> Error {
    let nan_count = gpu.iter().filter(|v| v.is_nan()).count();
    let max_abs = gpu.iter().zip(reference).map(|(g, r)| (g - r).abs()).fold(0.0f32, f32::max);
    let scale = reference.iter().fold(0.0f32, |m, r| m.max(r.abs()));
    let relative = if scale > 0.0 { max_abs / scale } else { max_abs };
    Error { max_abs, relative, nan_count }
}

impl Error {
    /// What was found, for the check line.
    pub fn summary(&self) -> String {
        let nans = if self.nan_count > 0 { format!(", {} NaN", self.nan_count) } else { String::new() };
        format!("max abs error {:.3e}, relative error {:.3e}{nans}", self.max_abs, self.relative)
    }
}
// ANCHOR_END: measure

// ANCHOR: checks
/// The verdicts of one `--check` run.
#[derive(Default)]
pub struct Checks {
    failed: Vec<String>,
}

impl Checks {
    /// Prints one verdict line and remembers a failure.
    pub fn record(&mut self, what: &str, measured: &str, limit: &str, pass: bool) {
        // The line's fields are separated by ": ", so WHAT must not contain one.
        let what = what.replace(": ", " - ");
        println!("check: {what}: {measured} (limit {limit}): {}", if pass { "PASS" } else { "FAIL" });
        if !pass {
            self.failed.push(what);
        }
    }

    /// Compares a GPU result with the reference: it passes when the relative error is
    /// within `limit` and there is no NaN.
    pub fn compare(&mut self, what: &str, gpu: &[f32], reference: &[f32], limit: f32) {
        if gpu.len() != reference.len() {
            let measured = format!("the GPU produced {} values, the reference {}", gpu.len(), reference.len());
            self.record(what, &measured, "equal counts", false);
            return;
        }
        self.record_error(what, &measure(gpu, reference), limit);
    }

    /// The verdict on an already measured error: no NaN, relative error within `limit`.
    pub fn record_error(&mut self, what: &str, error: &Error, limit: f32) {
        let pass = error.nan_count == 0 && error.relative <= limit;
        let limit = if limit == 0.0 { "0, exact".to_string() } else { format!("{limit:.1e} relative") };
        self.record(what, &error.summary(), &limit, pass);
    }

    // ANCHOR: compare_tokens
    /// Each generated token against the reference's choice from the same tokens before it
    /// (the largest of `reference` logits at that step). Only steps the arithmetic can
    /// decide are compared: where the reference's two best logits are further apart than
    /// twice the error `limit` allows, so that no correct engine could swap them.
    pub fn compare_tokens(&mut self, what: &str, gpu: &[u32], reference: &[Vec<f32>], limit: f32) {
        let (mut decided, mut differing) = (0, Vec::new());
        for (step, (&token, logits)) in gpu.iter().zip(reference).enumerate() {
            let (best, margin) = best_and_margin(logits);
            if margin > 2.0 * limit {
                decided += 1;
                if token != best {
                    differing.push(format!("step {step}: GPU {token}, reference {best}"));
                }
            }
        }
        let close = gpu.len() - decided;
        let close = if close > 0 { format!(" ({close} too close to call)") } else { String::new() };
        let measured = format!("{} of {decided} decided ids differ{close}", differing.len());
        self.record(what, &measured, "0", differing.is_empty());
        for difference in &differing {
            println!("       {difference}");
        }
    }
    // ANCHOR_END: compare_tokens    // ANCHOR_END: compare_tokens

    // ANCHOR: compare_steps
    /// Compares the logits of every generation step, each with the reference's logits for
    /// the same tokens: passes when every step's relative error is within `limit`.
    pub fn compare_steps(&mut self, what: &str, gpu: &[Vec<f32>], reference: &[Vec<f32>], limit: f32) {
        if gpu.len() != reference.len() || gpu.iter().zip(reference).any(|(g, r)| g.len() != r.len()) {
            self.record(what, &format!("{} GPU steps, {} reference steps", gpu.len(), reference.len()), "equal", false);
            return;
        }
        let errors: Vec<Error> = gpu.iter().zip(reference).map(|(g, r)| measure(g, r)).collect();
        // The worst step: any NaN first, then the largest relative error.
        let Some((worst, error)) = errors
            .iter()
            .enumerate()
            .max_by(|(_, a), (_, b)| a.nan_count.cmp(&b.nan_count).then(a.relative.total_cmp(&b.relative)))
        else {
            return;
        };
        let pass = errors.iter().all(|e| e.nan_count == 0 && e.relative <= limit);
        let measured = format!("worst of {} steps is step {worst}: {}", errors.len(), error.summary());
        self.record(what, &measured, &format!("{limit:.1e} relative"), pass);
        if !pass {
            let per_step: Vec<String> = errors.iter().map(|e| format!("{:.1e}", e.relative)).collect();
            println!("       relative error per step: {}", per_step.join(" "));
        }
    }
    // ANCHOR_END: compare_steps

    /// Fails if any comparison failed.
    pub fn finish(self) -> Result<()> {
        if !self.failed.is_empty() {
            bail!("{} check(s) failed: {}", self.failed.len(), self.failed.join("; "));
        }
        Ok(())
    }
}
// ANCHOR_END: checks

/// The index of the largest logit, and its lead over the second largest, relative to the
/// largest magnitude.
fn best_and_margin(logits: &[f32]) -> (u32, f32) {
    let (mut best, mut second) = ((0, f32::NEG_INFINITY), f32::NEG_INFINITY);
    for (index, &value) in logits.iter().enumerate() {
        if value > best.1 {
            (best, second) = ((index, value), best.1);
        } else if value > second {
            second = value;
        }
    }
    let scale = logits.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    (best.0 as u32, (best.1 - second) / scale)
}

// ANCHOR: limits
/// The largest relative error of one rounding to bf16, which keeps 8 significant bits.
pub const BF16_ROUNDING: f64 = 1.0 / 256.0;

/// The error a chain of bf16 roundings may leave in a result, from arithmetic alone.
///
/// One rounding moves a value by at most [`BF16_ROUNDING`] (`u`) of itself, by an amount
/// spread evenly over that range, so with a standard deviation of at most `u/√3`. Roundings are independent, so their errors add like a random walk:
/// variances add, each scaled by the size of the rounded values relative to the result.
/// Linear layers pass a random-looking error on at its relative size. Among N compared
/// values, the largest error sits about `√(2 ln N)` standard deviations out; we allow one
/// more.
#[derive(Default)]
pub struct RoundingBudget {
    /// Sum of squared standard deviations, in units of `u²`.
    variance: f64,
}

impl RoundingBudget {
    /// `count` roundings in series of values of size `scale`, relative to the result.
    pub fn add(&mut self, count: usize, scale: f64) {
        self.variance += count as f64 * scale * scale / 3.0;
    }

    /// The relative error allowed for the largest of `values` compared values.
    pub fn limit(&self, values: usize) -> f32 {
        let spread = (2.0 * (values.max(2) as f64).ln()).sqrt() + 1.0;
        (spread * BF16_ROUNDING * self.variance.sqrt()) as f32
    }
}
// ANCHOR_END: limits

// ANCHOR: growth
/// How large the reference's residual stream and each sublayer's change to it are on one
/// sequence (largest magnitudes): the sizes the end-to-end limit scales the roundings by.
/// They come from the reference alone, so the limits are the same on every machine.
pub struct Growth {
    /// Every sublayer in order (attention, MLP, attention, …).
    pub sublayers: Vec<SublayerSize>,
}

pub struct SublayerSize {
    /// bf16 roundings on the way from the sublayer's input to its change.
    pub roundings: usize,
    /// The largest element of the change, and of the stream after it.
    pub change: f64,
    pub stream: f64,
}

impl Growth {
    /// Runs the reference over `ids`, sublayer by sublayer.
    pub fn measure(reference: &Model, ids: &[u32]) -> anyhow::Result<Growth> {
        let positions: Vec<usize> = (0..ids.len()).collect();
        let mut x = reference.embed(ids)?;
        let mut sublayers = Vec::new();
        for layer in &reference.layers {
            let mut cache = LayerCache::default();
            let attended = layer.attention_block(&reference.config, &reference.inv_freq, &x, &positions, &mut cache);
            sublayers.push(SublayerSize::between(&x, &attended, ATTENTION_ROUNDINGS));
            let out = layer.mlp_block(&reference.config, &attended);
            sublayers.push(SublayerSize::between(&attended, &out, MLP_ROUNDINGS));
            x = out;
        }
        Ok(Growth { sublayers })
    }

    /// The limit for logits computed from the tokens, among `values` logits: every
    /// sublayer's roundings and every rounding of the stream, relative to the final stream,
    /// then the final norm's output. (The LM head is fp32 and adds no rounding; an error in
    /// the final hidden state reaches the logits at about its relative size.)
    pub fn logits_limit(&self, values: usize) -> f32 {
        let last = self.sublayers.last().map_or(1.0, |s| s.stream);
        let mut budget = RoundingBudget::default();
        for sublayer in &self.sublayers {
            budget.add(sublayer.roundings, sublayer.change / last);
            budget.add(1, sublayer.stream / last);
        }
        budget.add(1, 1.0);
        budget.limit(values)
    }
}

/// How close the residual add `output = input + change` came to exact, as a fraction of
/// what its roundings allow: half a bf16 step of the output, and as much again at the size
/// of the change, for its own rounding and for the two products' fp32 sums, which need not
/// add in the same order. Above 1, the add itself is wrong.
pub fn residual_add_error(input: &[f32], output: &[f32], change: &[f32]) -> f32 {
    let mut worst = 0.0f32;
    for ((i, o), c) in input.iter().zip(output).zip(change) {
        let allowed = BF16_ROUNDING as f32 * (o.abs() + 2.0 * c.abs());
        let gap = (o - i - c).abs();
        let ratio = if allowed > 0.0 {
            gap / allowed
        } else if gap > 0.0 {
            f32::INFINITY
        } else {
            0.0
        };
        worst = worst.max(if ratio.is_nan() { f32::INFINITY } else { ratio });
    }
    worst
}

impl SublayerSize {
    fn between(input: &Matrix, output: &Matrix, roundings: usize) -> Self {
        let largest = |values: &mut dyn Iterator<Item = f32>| values.fold(0.0f32, |m, v| m.max(v.abs())) as f64;
        let change = largest(&mut input.data.iter().zip(&output.data).map(|(a, b)| b - a));
        let stream = largest(&mut output.data.iter().copied());
        // A sublayer that changes nothing (zero weights) still has its stream rounded.
        SublayerSize { roundings, change: change.max(f64::MIN_POSITIVE), stream }
    }
}
// ANCHOR_END: growth

/// bf16 values as f32, for comparing.
pub fn to_f32(values: &[bf16]) -> Vec<f32> {
    values.iter().map(|v| v.to_f32()).collect()
}
