//! The engine's loop: many requests, each in a slot of the cache, decoded together.
//!
//! Between decode steps the scheduler admits waiting requests into free slots; each
//! admitted prompt is prefilled on its own (chapter 8's prefill, into its slot) and yields
//! its first token. Then one decode step runs one token of every sequence in a slot, as one
//! batch: every weight is read once for all of them. Each sequence stops on its own, by
//! chapter 8's rules (an end token, its budget, the context), and frees its slot.

use std::time::Instant;

use anyhow::{Result, ensure};

use crate::generate::{Stop, stop_reason};
use crate::model::Model;
use crate::requests::Request;
use crate::scheduler::{Occupancy, Policy, Scheduler, StepBatch};

/// A finished request.
pub struct Response {
    pub request: usize,
    /// The slot it ran in.
    pub slot: usize,
    /// The generated ids, including the stop token when one ended generation.
    pub tokens: Vec<u32>,
    pub stop: Stop,
    /// From the start of serving (when every request was submitted) to its first token.
    pub first_token_seconds: f64,
    /// The fp32 logits each token was chosen from, for the requests `--check` samples.
    pub step_logits: Vec<Vec<f32>>,
}

/// What a whole run did.
pub struct Summary {
    pub requests: usize,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// From the first request submitted to the last finished.
    pub seconds: f64,
    pub first_token_seconds: Vec<f64>,
    pub decode_steps: usize,
    pub peak_active: usize,
    pub largest_batch: usize,
    pub idle_slot_steps: usize,
    /// Which request held which slot over which decode steps.
    pub timeline: Vec<Occupancy>,
}

/// A request on its way: what it has generated so far.
struct InFlight {
    slot: usize,
    tokens: Vec<u32>,
    first_token_seconds: f64,
    step_logits: Vec<Vec<f32>>,
}

// ANCHOR: serve
/// Serves `requests` under `policy`, at most `max_batch` at a time (at most the cache's
/// slots), calling `finished` with each response as it completes; keeps the logits of every
/// step for the requests in `sampled`.
pub fn serve(
    model: &mut Model,
    requests: &[Request],
    policy: Policy,
    max_batch: usize,
    sampled: &[usize],
    mut finished: impl FnMut(Response) -> Result<()>,
) -> Result<Summary> {
    let start = Instant::now();
    let context = model.cache.capacity;
    let end_tokens = model.config.eos_token_id.clone();
    ensure!(
        max_batch > 0 && max_batch <= model.cache.slots,
        "a batch of {max_batch}, but the cache has {} slots",
        model.cache.slots
    );
    let mut scheduler = Scheduler::new(policy, max_batch, requests.len());
    let mut in_flight: Vec<Option<InFlight>> = (0..requests.len()).map(|_| None).collect();
    let mut batch = StepBatch::with_capacity(max_batch);
    let mut first_token_seconds = Vec::with_capacity(requests.len());
    let mut generated_tokens = 0;
    // Hands a stopped request's slot back and its response to the caller.
    let mut complete = |scheduler: &mut Scheduler, in_flight: &mut Vec<Option<InFlight>>, slot, stop| {
        let request = scheduler.finish(slot);
        let done = in_flight[request].take().expect("a finished request was in flight");
        generated_tokens += done.tokens.len();
        finished(Response {
            request,
            slot: done.slot,
            tokens: done.tokens,
            stop,
            first_token_seconds: done.first_token_seconds,
            step_logits: done.step_logits,
        })
    };

    while !scheduler.is_done() {
        // Admission: prefill each admitted prompt into its slot, one at a time. A request
        // that stops at its first token frees its slot at once, so admit until none comes.
        loop {
            let admitted = scheduler.admit();
            if admitted.is_empty() {
                break;
            }
            for (request, slot) in admitted {
                let Request { prompt, max_new_tokens } = &requests[request];
                let mut flight = InFlight {
                    slot,
                    tokens: Vec::with_capacity(*max_new_tokens),
                    first_token_seconds: 0.0,
                    step_logits: Vec::new(),
                };
                if *max_new_tokens == 0 {
                    in_flight[request] = Some(flight);
                    complete(&mut scheduler, &mut in_flight, slot, Stop::Budget)?;
                    continue;
                }
                model.forward(slot, prompt)?;
                if sampled.contains(&request) {
                    flight.step_logits.push(model.logits_row(0)?);
                }
                let first = model.next_tokens()?[0];
                flight.tokens.push(first);
                flight.first_token_seconds = start.elapsed().as_secs_f64();
                first_token_seconds.push(flight.first_token_seconds);
                in_flight[request] = Some(flight);
                match stop_reason(first, &end_tokens, 1, *max_new_tokens, prompt.len(), context) {
                    Some(stop) => complete(&mut scheduler, &mut in_flight, slot, stop)?,
                    None => scheduler.start(slot, prompt.len(), first),
                }
            }
        }
        if scheduler.active() == 0 {
            continue; // every admitted request stopped at its first token
        }

        // One decode step: a token of every sequence in a slot.
        scheduler.step_batch(&mut batch);
        model.decode(&batch)?;
        for row in 0..batch.len() {
            let slot = batch.slots[row] as usize;
            let request = scheduler.running(slot).expect("a row's slot is running").request;
            if sampled.contains(&request) {
                let logits = model.logits_row(row)?;
                in_flight[request].as_mut().expect("running").step_logits.push(logits);
            }
        }
        let chosen = model.next_tokens()?;
        for (row, &token) in chosen.iter().enumerate() {
            let slot = batch.slots[row] as usize;
            let request = scheduler.running(slot).expect("a row's slot is running").request;
            let flight = in_flight[request].as_mut().expect("running");
            flight.tokens.push(token);
            // The token was predicted from the row's position and every one before it.
            let processed = batch.positions[row] as usize + 1;
            let max_new_tokens = requests[request].max_new_tokens;
            match stop_reason(token, &end_tokens, flight.tokens.len(), max_new_tokens, processed, context) {
                Some(stop) => complete(&mut scheduler, &mut in_flight, slot, stop)?,
                None => scheduler.advance(slot, token),
            }
        }
    }
    Ok(Summary {
        requests: requests.len(),
        prompt_tokens: requests.iter().map(|r| r.prompt.len()).sum(),
        generated_tokens,
        seconds: start.elapsed().as_secs_f64(),
        first_token_seconds,
        decode_steps: scheduler.steps,
        peak_active: scheduler.peak_active,
        largest_batch: scheduler.largest_batch,
        idle_slot_steps: scheduler.idle_slot_steps,
        timeline: scheduler.timeline,
    })
}
// ANCHOR_END: serve

impl Summary {
    // ANCHOR: summary
    /// The run in a few lines: sizes, time, throughput by the bench's definition, time to
    /// first token, and how full the slots were.
    pub fn print(&self, slots: usize) {
        println!(
            "served  {} requests: {} prompt tokens, {} generated tokens in {:.3} s: {:.1} tokens/s",
            self.requests,
            self.prompt_tokens,
            self.generated_tokens,
            self.seconds,
            self.generated_tokens as f64 / self.seconds
        );
        let mut first = self.first_token_seconds.clone();
        first.sort_by(f64::total_cmp);
        if !first.is_empty() {
            let percentile = |p: f64| first[((first.len() - 1) as f64 * p).round() as usize] * 1e3;
            println!("        time to first token: median {:.1} ms, p90 {:.1} ms", percentile(0.5), percentile(0.9));
        }
        let slot_steps = self.decode_steps * slots;
        let idle = if slot_steps > 0 { 100.0 * self.idle_slot_steps as f64 / slot_steps as f64 } else { 0.0 };
        println!(
            "        {} decode steps; peak {} active requests, largest decode batch {}; {} idle slot-steps of {slot_steps} ({idle:.1}%)",
            self.decode_steps, self.peak_active, self.largest_batch, self.idle_slot_steps
        );
    }
    // ANCHOR_END: summary
}
