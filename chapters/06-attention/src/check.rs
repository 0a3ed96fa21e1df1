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
