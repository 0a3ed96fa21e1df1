//! Comparing what the GPU computed with the CPU reference (`llama-reference`).
//!
//! Every `--check` prints one line per comparison, in a form `cargo x gpu-check` reads:
//! `check: WHAT: max abs error A, relative error R (limit L): PASS`. All comparisons run
//! and print before the program fails, so one run shows every result.

use anyhow::{Result, bail};
use half::bf16;

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
// ANCHOR_END: measure

// ANCHOR: checks
/// The comparisons of one `--check` run.
#[derive(Default)]
pub struct Checks {
    failed: Vec<String>,
}

impl Checks {
    /// Compares a GPU result with the reference: it passes when the relative error is
    /// within `limit` and there is no NaN.
    pub fn compare(&mut self, what: &str, gpu: &[f32], reference: &[f32], limit: f32) {
        if gpu.len() != reference.len() {
            println!("check: {what}: the GPU produced {} values, the reference {}: FAIL", gpu.len(), reference.len());
            self.failed.push(what.to_string());
            return;
        }
        self.record(what, measure(gpu, reference), limit);
    }

    /// Prints one check line for an already measured error.
    pub fn record(&mut self, what: &str, error: Error, limit: f32) {
        let pass = error.nan_count == 0 && error.relative <= limit;
        let nans = if error.nan_count > 0 { format!(", {} NaN", error.nan_count) } else { String::new() };
        println!(
            "check: {what}: max abs error {:.3e}, relative error {:.3e} (limit {limit:.0e}){nans}: {}",
            error.max_abs,
            error.relative,
            if pass { "PASS" } else { "FAIL" }
        );
        if !pass {
            self.failed.push(what.to_string());
        }
    }

    /// Fails if any comparison failed.
    pub fn finish(self) -> Result<()> {
        if !self.failed.is_empty() {
            bail!("{} check(s) failed: {}", self.failed.len(), self.failed.join("; "));
        }
        Ok(())
    }
}
// ANCHOR_END: checks

/// bf16 values as f32, for comparing.
pub fn to_f32(values: &[bf16]) -> Vec<f32> {
    values.iter().map(|v| v.to_f32()).collect()
}
