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

use std::path::Path;

use anyhow::{Context, Result, bail};
use half::bf16;
use llama_reference::{LayerCache, Matrix};

use crate::kv_cache::KvCache;
use crate::model::{ATTENTION_ROUNDINGS, MLP_ROUNDINGS, Model, Moment, Sublayer};
use crate::ops;
use crate::page_pool::pages_for;
use crate::scheduler::StepBatch;
use crate::serve::Response;

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
    // ANCHOR_END: compare_tokens

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
    pub fn measure(reference: &llama_reference::Model, ids: &[u32]) -> anyhow::Result<Growth> {
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

// ANCHOR: check_against_reference
/// Checks each sampled request: in one forward pass over its prompt watched by a hook, the
/// embedding and then every sublayer on the GPU's own input to it; then, from the tokens,
/// the logits of the prompt's last position (that same pass's) and of every generation
/// step of the batched run, and its greedy tokens. Every limit comes from the arithmetic
/// (see above).
pub fn check_against_reference(model: &mut Model, model_dir: &Path, sampled: &[(&[u32], &Response)]) -> Result<()> {
    let reference = llama_reference::Model::load(model_dir).context("loading the CPU reference model")?;
    let mut checks = Checks::default();
    for (ids, response) in sampled {
        check_request(model, &reference, &mut checks, ids, response)?;
    }
    checks.finish()
}

fn check_request(
    model: &mut Model,
    reference: &llama_reference::Model,
    checks: &mut Checks,
    ids: &[u32],
    response: &Response,
) -> Result<()> {
    let request = format!("request {}", response.request);
    // The limits scale with the sizes the reference's stream takes on the whole sequence.
    let sequence = [ids, &response.tokens].concat();
    let growth = Growth::measure(reference, &sequence)?;

    let mut watch = SublayerWatch::new(reference, ids.len());
    with_own_pool(model, ids.len(), |model, block_table| {
        model.forward_with_hook(block_table, ids, |model, layer, sublayer, moment| {
            watch.see(model, layer, sublayer, moment)
        })
    })?;
    // Chapter 3's check: the embedding rows are copies, exact.
    let what = format!("{request}: embedding rows of {} prompt tokens", ids.len());
    checks.compare(&what, &watch.embedded, &reference.embed(ids)?.data, 0.0);
    watch.record(checks, &request, model.config.num_hidden_layers);

    // From the tokens, as a user sees it: the bf16 rounding of all layers included.
    let logits_limit = growth.logits_limit(model.config.vocab_size);
    let logits = model.logits_row(0)?;
    let what = format!("{request}: logits of the prompt's last position, all from the tokens");
    checks.compare(&what, &logits, &reference.last_logits(ids)?, logits_limit);
    let generated = response.tokens.len();
    if generated > 0 {
        let expected_steps = reference.step_logits(ids, &response.tokens)?;
        let what =
            format!("{request}: logits of each of the {generated} generation steps, batched, on the GPU's tokens");
        checks.compare_steps(&what, &response.step_logits, &expected_steps, logits_limit);
        let what = format!("{request}: each of the {generated} greedy tokens, batched, on the GPU's tokens before it");
        checks.compare_tokens(&what, &response.tokens, &expected_steps, logits_limit);

        // Chapter 8's check: every decode step against chapter 7's way, the oracle.
        let recomputed = recompute_step_logits(model, ids, &response.tokens)?;
        let what =
            format!("{request}: logits of each of the {generated} steps, batched decode vs recomputing the sequence");
        checks.compare_steps(&what, &response.step_logits, &recomputed, logits_limit);

        // ANCHOR: check_alone
        // Chapter 9's: the batched steps against the same request decoded alone, chapter 8's way.
        let (alone, alone_kv) = alone_step_logits(model, ids, &response.tokens)?;
        let what = format!("{request}: logits of each of the {generated} steps, in its batches vs decoded alone");
        checks.compare_steps(&what, &response.step_logits, &alone, logits_limit);
        let what = format!("{request}: each of the {generated} greedy tokens, in its batches vs decoded alone");
        checks.compare_tokens(&what, &response.tokens, &alone, logits_limit);
        // ANCHOR_END: check_alone

        // ANCHOR: check_pages
        // Chapter 10's own: what its pages held, gathered through its block table just before
        // they went back, against chapter 8's contiguous cache of the same request decoded alone.
        let positions = ids.len() + generated - 1;
        let what = format!(
            "{request}: keys and values of {positions} positions in every layer, gathered through its block table vs decoded alone"
        );
        compare_cached_kv(checks, &what, &response.cached_kv, &alone_kv, logits_limit);
        // ANCHOR_END: check_pages
    }
    Ok(())
}

/// Runs `f` on a pool of its own, just large enough for `positions` positions, whose pages
/// are numbered in order (block table 0, 1, 2, …): the sequence's rows are then one
/// contiguous matrix per layer, chapter 8's cache. The model's pool is untouched.
fn with_own_pool<T>(model: &mut Model, positions: usize, f: impl FnOnce(&mut Model, &[u32]) -> Result<T>) -> Result<T> {
    let pages = pages_for(positions.max(1));
    let block_table: Vec<u32> = (0..pages as u32).collect();
    let mut own = KvCache::new(&model.gpu, &model.config, pages)?;
    std::mem::swap(&mut model.cache, &mut own);
    let result = f(model, &block_table);
    std::mem::swap(&mut model.cache, &mut own);
    result
}

// ANCHOR: recompute
/// Chapter 7's generation, kept as the oracle: the logits of every step computed by running
/// the whole sequence so far from position 0 (a prefill of it). It runs on a pool of its
/// own, so that it never writes into the model's.
fn recompute_step_logits(model: &mut Model, prompt: &[u32], generated: &[u32]) -> Result<Vec<Vec<f32>>> {
    let sequence = [prompt, generated].concat();
    with_own_pool(model, sequence.len(), |model, block_table| {
        (0..generated.len())
            .map(|step| {
                model.forward(block_table, &sequence[..prompt.len() + step])?;
                model.logits_row(0)
            })
            .collect()
    })
}
// ANCHOR_END: recompute

/// Each layer's keys and values of a sequence, `[positions, kv_heads · head_dim]` each.
type LayerKv = (Vec<bf16>, Vec<bf16>);

/// Chapter 8's generation: the prompt prefilled, then each generated token decoded as a
/// batch of one, on a pool of its own whose pages are in order. Its logits are what the
/// request's would be had it run alone, and its cache is chapter 8's contiguous one.
fn alone_step_logits(model: &mut Model, prompt: &[u32], generated: &[u32]) -> Result<(Vec<Vec<f32>>, Vec<LayerKv>)> {
    let positions = prompt.len() + generated.len() - 1;
    let width = model.batch.table_width;
    with_own_pool(model, positions, |model, block_table| {
        model.forward(block_table, prompt)?;
        let mut steps = vec![model.logits_row(0)?];
        for (step, &token) in generated.iter().enumerate().take(generated.len() - 1) {
            model.decode(&StepBatch::single(token, prompt.len() + step, block_table, width))?;
            steps.push(model.logits_row(0)?);
        }
        let cache = (0..model.cache.layers).map(|layer| model.cache.gather(&model.gpu, layer, block_table, positions));
        Ok((steps, cache.collect::<Result<_>>()?))
    })
}

/// Every layer's keys and values gathered from the pages against chapter 8's contiguous
/// cache: one verdict, on the layer furthest from its match.
fn compare_cached_kv(checks: &mut Checks, what: &str, paged: &[LayerKv], contiguous: &[LayerKv], limit: f32) {
    if paged.len() != contiguous.len() {
        let measured = format!("{} layers gathered, {} expected", paged.len(), contiguous.len());
        checks.record(what, &measured, "equal counts", false);
        return;
    }
    let errors = paged.iter().zip(contiguous).map(|((k, v), (k_alone, v_alone))| {
        let (gathered, expected) = (to_f32(&[&k[..], &v[..]].concat()), to_f32(&[&k_alone[..], &v_alone[..]].concat()));
        if gathered.len() == expected.len() {
            measure(&gathered, &expected)
        } else {
            Error {
                max_abs: f32::INFINITY,
                relative: f32::INFINITY,
                nan_count: gathered.len().abs_diff(expected.len()),
            }
        }
    });
    let worst = errors
        .enumerate()
        .max_by(|(_, a), (_, b)| a.nan_count.cmp(&b.nan_count).then(a.relative.total_cmp(&b.relative)));
    if let Some((layer, error)) = worst {
        let what = format!("{what} (worst: layer {layer})");
        checks.record_error(&what, &error, limit);
    }
}

/// The forward pass's hook for `--check`: before each sublayer it keeps the stream (the
/// sublayer's input); after it, it measures the sublayer's change to the stream (its output
/// projection's product, before the residual add) against the reference's change on that
/// same input, so each measurement is that sublayer's own error, not the drift of the ones
/// before; then the residual add itself, against the roundings it allows.
struct SublayerWatch<'a> {
    reference: &'a llama_reference::Model,
    positions: Vec<usize>,
    /// The embedding rows: the stream before the first sublayer.
    embedded: Vec<f32>,
    /// The stream before the sublayer running now.
    input: Matrix,
    /// (how far toward its limit, which sublayer, error, limit) of the worst change.
    worst_change: Option<(f32, String, Error, f32)>,
    /// The worst residual add, as a fraction of what its roundings allow.
    worst_add: (f32, String),
}

impl<'a> SublayerWatch<'a> {
    fn new(reference: &'a llama_reference::Model, rows: usize) -> Self {
        SublayerWatch {
            reference,
            positions: (0..rows).collect(),
            embedded: Vec::new(),
            input: Matrix::from_vec(0, 0, Vec::new()),
            worst_change: None,
            worst_add: (0.0, String::new()),
        }
    }

    fn see(&mut self, model: &Model, layer: usize, sublayer: Sublayer, moment: Moment) -> Result<()> {
        let stream = model.read(&model.act.x)?;
        if moment == Moment::Before {
            if layer == 0 && sublayer == Sublayer::Attention {
                self.embedded = stream.clone();
            }
            self.input = Matrix::from_vec(self.positions.len(), model.config.hidden_size, stream);
            return Ok(());
        }
        let change = sublayer_change(model, layer, sublayer)?;
        let (reference, reference_layer) = (self.reference, &self.reference.layers[layer]);
        let (expected, roundings) = match sublayer {
            Sublayer::Attention => {
                let mut cache = LayerCache::default();
                let (config, inv_freq) = (&reference.config, &reference.inv_freq);
                let out = reference_layer.attention_block(config, inv_freq, &self.input, &self.positions, &mut cache);
                (out, ATTENTION_ROUNDINGS)
            }
            Sublayer::Mlp => (reference_layer.mlp_block(&reference.config, &self.input), MLP_ROUNDINGS),
        };
        let expected_change: Vec<f32> = expected.data.iter().zip(&self.input.data).map(|(o, i)| o - i).collect();
        let error = measure(&change, &expected_change);
        let mut budget = RoundingBudget::default();
        budget.add(roundings, 1.0);
        let limit = budget.limit(change.len());
        let which = format!("layer {layer}'s {}", if sublayer == Sublayer::Attention { "attention" } else { "MLP" });
        // NaN anywhere is worse than any finite error.
        let toward = if error.nan_count > 0 { f32::INFINITY } else { error.relative / limit };
        if self.worst_change.as_ref().is_none_or(|w| toward > w.0) {
            self.worst_change = Some((toward, which.clone(), error, limit));
        }
        let add = residual_add_error(&self.input.data, &stream, &change);
        if add >= self.worst_add.0 {
            self.worst_add = (add, which);
        }
        Ok(())
    }

    /// Two verdicts: the sublayer nearest its limit, and the worst residual add.
    fn record(&self, checks: &mut Checks, request: &str, layers: usize) {
        let sublayers = 2 * layers;
        if let Some((_, which, error, limit)) = &self.worst_change {
            let what = format!(
                "{request}: each of the {sublayers} sublayers' change on its GPU input (nearest its limit - {which})"
            );
            checks.record_error(&what, error, *limit);
        }
        let (add, which) = &self.worst_add;
        let what =
            format!("{request}: each of the {sublayers} residual adds, output - input - change (worst - {which})");
        let measured = if *add < 100.0 {
            format!("{add:.2} of what its roundings allow")
        } else {
            format!("{add:.1e} times what its roundings allow")
        };
        checks.record(&what, &measured, "1", *add <= 1.0);
    }
}

/// What a sublayer that just ran added to the stream: its output projection applied again
/// to the input it projected (still in `attended`, or in `gate` for the MLP), into a
/// buffer of the check's own.
fn sublayer_change(model: &Model, layer: usize, sublayer: Sublayer) -> Result<Vec<f32>> {
    let (config, weights, act) = (&model.config, &model.weights.layers[layer], &model.act);
    let (projected, projection, width) = match sublayer {
        Sublayer::Attention => (&act.attended, &weights.o_proj, config.num_attention_heads * config.head_dim),
        Sublayer::Mlp => (&act.gate, &weights.down_proj, config.intermediate_size),
    };
    let mut change = model.gpu.alloc_nan::<bf16>(model.rows * config.hidden_size)?;
    let projected = projected.slice(..model.rows * width);
    ops::linear(&model.gpu, &projected, projection, &mut change.slice_mut(..), width)?;
    Ok(to_f32(&model.gpu.stream.clone_dtoh(&change)?))
}
// ANCHOR_END: check_against_reference
