//! The figures every chapter reports the same way, whatever its model's type: the weights'
//! load and one sequence alone. Each chapter's module drives its own model and hands its
//! timings here, so that these figures' names and definitions live in one place.

use anyhow::Result;

use crate::record::{Measurement, Part, median, repeat};
use crate::workload::{Request, Workloads};

/// `load_s` from the seconds of each timed load, and `load_gb_per_s` over the bytes of the
/// checkpoint's tensors (name, bytes).
pub fn load(seconds: Vec<f64>, tensors: &[(&str, usize)], part: &mut Part) {
    let bytes: usize = tensors.iter().map(|(_, b)| b).sum();
    let detail = "open and validate the files, allocate and copy every tensor; page cache warm";
    let load = Measurement::of_runs("load_s", "s", seconds, detail);
    let rate = bytes as f64 / 1e9 / load.value;
    part.push(load);
    part.push(Measurement::derived("load_gb_per_s", "GB/s", rate, &format!("{:.2} GB of tensors", bytes as f64 / 1e9)));
}

/// The single-sequence figures: `decode_step_ms` (and its rate) and `ttft_ms` from the
/// single workload, `prefill_ms` (and its rate) from the prefill one. `run` serves one
/// request alone, each step waiting for its token, and returns the seconds to its first
/// token and per later token on average.
pub fn single_sequence(
    workloads: &Workloads,
    runs: usize,
    part: &mut Part,
    mut run: impl FnMut(&Request) -> Result<(f64, f64)>,
) -> Result<()> {
    let single = &workloads.single;
    let (mut first, mut step) = (Vec::new(), Vec::new());
    run(single)?;
    for _ in 0..runs {
        let (f, s) = run(single)?;
        first.push(f * 1e3);
        step.push(s * 1e3);
    }
    let what = format!("prompt {}, {} generated; host clock", single.prompt.len(), single.new_tokens);
    let step = Measurement::of_runs("decode_step_ms", "ms", step, &format!("{what}, each step waits for its token"));
    part.push(Measurement::derived("decode_tokens_per_s", "tokens/s", 1e3 / step.value, "1 / decode_step_ms"));
    part.push(step);
    part.push(Measurement::of_runs("ttft_ms", "ms", first, &format!("{what}: prefill and the first token")));

    let prefill = &workloads.prefill;
    let times = repeat(runs, || Ok(run(prefill)?.0 * 1e3))?;
    let prefill_ms = median(&times);
    let what = format!("one {}-token prompt to its first token", prefill.prompt.len());
    part.push(Measurement::of_runs("prefill_ms", "ms", times, &what));
    let rate = prefill.prompt.len() as f64 / (prefill_ms / 1e3);
    part.push(Measurement::derived("prefill_tokens_per_s", "tokens/s", rate, "prompt tokens / prefill_ms"));
    Ok(())
}
