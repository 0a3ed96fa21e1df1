//! Comparing what the GPU computed with the CPU reference (`llama-reference`).
//!
//! Every `--check` prints one line per comparison, in a form `cargo x gpu-check` reads:
//! `check: WHAT: max abs error A, relative error R (limit L): PASS`.

use anyhow::{Result, bail};
use half::bf16;

// ANCHOR: compare
/// How far `gpu` is from `reference`: the largest absolute difference, and that
/// difference relative to the largest reference magnitude. A NaN anywhere fails.
pub fn compare(what: &str, gpu: &[f32], reference: &[f32], limit: f32) -> Result<()> {
    if gpu.len() != reference.len() {
        bail!("{what}: the GPU produced {} values, the reference {}", gpu.len(), reference.len());
    }
    let nan_count = gpu.iter().filter(|v| v.is_nan()).count();
    let max_abs = gpu.iter().zip(reference).map(|(g, r)| (g - r).abs()).fold(0.0f32, f32::max);
    let scale = reference.iter().fold(0.0f32, |m, r| m.max(r.abs()));
    let relative = if scale > 0.0 { max_abs / scale } else { max_abs };
    let pass = nan_count == 0 && relative <= limit;
    println!(
        "check: {what}: max abs error {max_abs:.3e}, relative error {relative:.3e} (limit {limit:.0e}){}: {}",
        if nan_count > 0 { format!(", {nan_count} NaN") } else { String::new() },
        if pass { "PASS" } else { "FAIL" }
    );
    if !pass {
        bail!("{what} does not match the reference");
    }
    Ok(())
}
// ANCHOR_END: compare

// ANCHOR: compare_tokens
/// Token ids must be equal: the "error" is the number of positions that differ.
pub fn compare_tokens(what: &str, gpu: &[u32], reference: &[u32]) -> Result<()> {
    let differing = gpu.iter().zip(reference).filter(|(g, r)| g != r).count() + gpu.len().abs_diff(reference.len());
    let pass = differing == 0;
    println!(
        "check: {what}: max abs error {differing}, relative error {differing} (limit 0, differing ids): {}",
        if pass { "PASS" } else { "FAIL" }
    );
    if !pass {
        bail!("{what} differ: GPU {gpu:?}, reference {reference:?}");
    }
    Ok(())
}
// ANCHOR_END: compare_tokens

/// bf16 values as f32, for comparing.
pub fn to_f32(values: &[bf16]) -> Vec<f32> {
    values.iter().map(|v| v.to_f32()).collect()
}
