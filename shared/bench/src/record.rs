//! What a benchmark part writes: a JSON file of measurements, one per figure.
//!
//! `cargo x bench` reads these files (and those of the transformers script, which writes
//! the same shape) and merges them into one report. The format:
//!
//! ```json
//! {"system": "ch08-kv-cache", "mode": "", "environment": {...},
//!  "measurements": [{"figure": "decode_step_ms", "value": 1.91, "unit": "ms",
//!                    "runs": [1.92, 1.91, 1.90], "detail": "..."}]}
//! ```
//!
//! `value` is the median of `runs`, each run measured after a warm-up.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

/// One figure: its median and every run it is the median of.
#[derive(Serialize)]
pub struct Measurement {
    pub figure: String,
    pub value: f64,
    pub unit: String,
    pub runs: Vec<f64>,
    /// How it was measured, in a few words.
    pub detail: String,
}

impl Measurement {
    pub fn of_runs(figure: &str, unit: &str, runs: Vec<f64>, detail: &str) -> Self {
        Measurement { figure: figure.into(), value: median(&runs), unit: unit.into(), runs, detail: detail.into() }
    }

    /// A figure computed from others (a rate from a time, a floor from a bandwidth): no runs of its own.
    pub fn derived(figure: &str, unit: &str, value: f64, detail: &str) -> Self {
        Measurement { figure: figure.into(), value, unit: unit.into(), runs: Vec::new(), detail: detail.into() }
    }
}

/// Everything one part measured, for one system.
#[derive(Serialize)]
pub struct Part {
    pub system: String,
    /// How the system ran, where it could run more than one way (empty for ours).
    pub mode: String,
    /// Facts about where it ran: the GPU, the driver, the model.
    pub environment: serde_json::Map<String, serde_json::Value>,
    pub measurements: Vec<Measurement>,
}

impl Part {
    pub fn new(system: &str) -> Self {
        Part { system: system.into(), mode: String::new(), environment: Default::default(), measurements: Vec::new() }
    }

    pub fn note(&mut self, key: &str, value: impl Into<serde_json::Value>) {
        self.environment.insert(key.into(), value.into());
    }

    pub fn push(&mut self, measurement: Measurement) {
        println!(
            "bench: {} {} = {:.4} {} ({})",
            self.system, measurement.figure, measurement.value, measurement.unit, measurement.detail
        );
        self.measurements.push(measurement);
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
    }
}

/// The middle value (the mean of the two middle ones for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Runs `measure` once to warm up (compilation, caches, clocks), then `runs` times.
pub fn repeat(runs: usize, mut measure: impl FnMut() -> Result<f64>) -> Result<Vec<f64>> {
    measure()?;
    (0..runs).map(|_| measure()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn repeat_discards_the_warm_up() {
        let mut calls = 0.0;
        let runs = repeat(3, || {
            calls += 1.0;
            Ok(calls)
        })
        .unwrap();
        assert_eq!(runs, vec![2.0, 3.0, 4.0]);
    }
}
