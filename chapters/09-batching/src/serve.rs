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
    finished: impl FnMut(Response) -> Result<()>,
) -> Result<Summary> {
    ensure!(
        max_batch > 0 && max_batch <= model.cache.slots,
        "a batch of {max_batch}, but the cache has {} slots",
        model.cache.slots
    );
    let mut serving = Serving {
        requests,
        sampled,
        context: model.cache.capacity,
        end_tokens: model.config.eos_token_id.clone(),
        start: Instant::now(),
        scheduler: Scheduler::new(policy, max_batch, requests.len()),
        in_flight: (0..requests.len()).map(|_| None).collect(),
        batch: StepBatch::with_capacity(max_batch),
        first_token_seconds: Vec::with_capacity(requests.len()),
        generated_tokens: 0,
        finished,
    };
    while !serving.scheduler.is_done() {
        serving.admit(model)?;
        if serving.scheduler.active() > 0 {
            serving.decode_step(model)?;
        }
    }
    Ok(serving.summary())
}

/// The state of one run of [`serve`].
struct Serving<'a, F> {
    requests: &'a [Request],
    sampled: &'a [usize],
    context: usize,
    end_tokens: Vec<u32>,
    start: Instant,
    scheduler: Scheduler,
    /// Each request's progress while it holds a slot.
    in_flight: Vec<Option<InFlight>>,
    batch: StepBatch,
    first_token_seconds: Vec<f64>,
    generated_tokens: usize,
    finished: F,
}

impl<F: FnMut(Response) -> Result<()>> Serving<'_, F> {
    /// Admission: prefills each admitted prompt into its slot, one at a time. A request that
    /// stops at its first token frees its slot at once, so it admits until none comes.
    fn admit(&mut self, model: &mut Model) -> Result<()> {
        loop {
            let admitted = self.scheduler.admit();
            if admitted.is_empty() {
                return Ok(());
            }
            for (request, slot) in admitted {
                self.prefill(model, request, slot)?;
            }
        }
    }

    /// The prompt of `request` into `slot`, and its first token.
    fn prefill(&mut self, model: &mut Model, request: usize, slot: usize) -> Result<()> {
        let Request { prompt, max_new_tokens } = &self.requests[request];
        let mut flight = InFlight {
            slot,
            tokens: Vec::with_capacity(*max_new_tokens),
            first_token_seconds: 0.0,
            step_logits: Vec::new(),
        };
        if *max_new_tokens == 0 {
            self.in_flight[request] = Some(flight);
            return self.complete(slot, Stop::Budget);
        }
        model.forward(slot, prompt)?;
        if self.sampled.contains(&request) {
            flight.step_logits.push(model.logits_row(0)?);
        }
        let first = model.next_tokens()?[0];
        flight.tokens.push(first);
        flight.first_token_seconds = self.start.elapsed().as_secs_f64();
        self.first_token_seconds.push(flight.first_token_seconds);
        self.in_flight[request] = Some(flight);
        match stop_reason(first, &self.end_tokens, 1, *max_new_tokens, prompt.len(), self.context) {
            Some(stop) => self.complete(slot, stop),
            None => {
                self.scheduler.start(slot, prompt.len(), first);
                Ok(())
            }
        }
    }

    /// One decode step: a token of every sequence in a slot, each checked against the stop rule.
    fn decode_step(&mut self, model: &mut Model) -> Result<()> {
        self.scheduler.step_batch(&mut self.batch);
        model.decode(&self.batch)?;
        for row in 0..self.batch.len() {
            let request = self.request_in_row(row);
            if self.sampled.contains(&request) {
                let logits = model.logits_row(row)?;
                self.in_flight[request].as_mut().expect("running").step_logits.push(logits);
            }
        }
        let chosen = model.next_tokens()?;
        for (row, &token) in chosen.iter().enumerate() {
            let (slot, request) = (self.batch.slots[row] as usize, self.request_in_row(row));
            let flight = self.in_flight[request].as_mut().expect("running");
            flight.tokens.push(token);
            // The token was predicted from the row's position and every one before it.
            let processed = self.batch.positions[row] as usize + 1;
            let max_new_tokens = self.requests[request].max_new_tokens;
            match stop_reason(token, &self.end_tokens, flight.tokens.len(), max_new_tokens, processed, self.context) {
                Some(stop) => self.complete(slot, stop)?,
                None => self.scheduler.advance(slot, token),
            }
        }
        Ok(())
    }

    /// The request whose sequence is row `row` of the step's batch.
    fn request_in_row(&self, row: usize) -> usize {
        let slot = self.batch.slots[row] as usize;
        self.scheduler.running(slot).expect("a row's slot is running").request
    }

    /// A stopped request: its slot back to the scheduler, its response to the caller.
    fn complete(&mut self, slot: usize, stop: Stop) -> Result<()> {
        let request = self.scheduler.finish(slot);
        let done = self.in_flight[request].take().expect("a finished request was in flight");
        self.generated_tokens += done.tokens.len();
        (self.finished)(Response {
            request,
            slot: done.slot,
            tokens: done.tokens,
            stop,
            first_token_seconds: done.first_token_seconds,
            step_logits: done.step_logits,
        })
    }

    fn summary(self) -> Summary {
        Summary {
            requests: self.requests.len(),
            prompt_tokens: self.requests.iter().map(|r| r.prompt.len()).sum(),
            generated_tokens: self.generated_tokens,
            seconds: self.start.elapsed().as_secs_f64(),
            first_token_seconds: self.first_token_seconds,
            decode_steps: self.scheduler.steps,
            peak_active: self.scheduler.peak_active,
            largest_batch: self.scheduler.largest_batch,
            idle_slot_steps: self.scheduler.idle_slot_steps,
            timeline: self.scheduler.timeline,
        }
    }
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
