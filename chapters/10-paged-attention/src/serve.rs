//! The engine's loop: many requests, their keys and values in pages of one pool, decoded
//! together.
//!
//! Between decode steps the scheduler admits waiting requests whose page budgets fit; each
//! admitted prompt is prefilled on its own (chapter 8's prefill, into the pages it was
//! given) and yields its first token. Then one decode step runs one token of every running
//! sequence, as one batch: every weight is read once for all of them. Each sequence stops on
//! its own, by chapter 8's rules (an end token, its budget, the context), and gives back
//! its pages and credits.

use std::time::Instant;

use anyhow::{Result, ensure};
use half::bf16;

use crate::generate::{Stop, room_after, stop_reason};
use crate::model::Model;
use crate::page_pool::PAGE_SIZE;
use crate::requests::Request;
use crate::scheduler::{Admission, Demand, Occupancy, Policy, Scheduler, StepBatch};

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
    /// For the requests `--check` samples: each layer's keys and values of every cached
    /// position, gathered through the block table just before its pages went back.
    pub cached_kv: Vec<(Vec<bf16>, Vec<bf16>)>,
}

/// A request that can never run: its page budget is larger than the whole pool.
pub struct Rejected {
    pub request: usize,
    pub pages: usize,
}

/// What a whole run did.
pub struct Summary {
    /// Requests served, and their prompts' tokens (the rejected ones are not counted).
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
    pub pool_pages: usize,
    pub peak_assigned_pages: usize,
    pub admission_waits: usize,
    /// Optimistic admission: requests preempted, and prefix tokens prefilled again to resume them.
    pub preemptions: usize,
    pub recomputed_tokens: usize,
    /// Free pages after the run: every page, unless one leaked.
    pub free_pages: usize,
    pub rejected: Vec<Rejected>,
}

/// A request on its way: what it has generated so far.
struct InFlight {
    slot: usize,
    tokens: Vec<u32>,
    first_token_seconds: f64,
    step_logits: Vec<Vec<f32>>,
}

// ANCHOR: serve
/// Serves `requests` under `policy`, at most `max_batch` at a time (at most the model's
/// batch buffers), their keys and values in the model's pool, calling `finished` with each
/// response as it completes; keeps the logits of every step for the requests in `sampled`.
/// A request larger than the pool is rejected (listed in the summary); the others run.
pub fn serve(
    model: &mut Model,
    requests: &[Request],
    policy: Policy,
    admission: Admission,
    max_batch: usize,
    sampled: &[usize],
    finished: impl FnMut(Response) -> Result<()>,
) -> Result<Summary> {
    ensure!(
        max_batch > 0 && max_batch <= model.batch.max_batch,
        "a batch of {max_batch}, but the buffers hold {}",
        model.batch.max_batch
    );
    let context = model.context;
    let demands = requests
        .iter()
        .map(|r| Demand::new(r.prompt.len(), r.max_new_tokens.min(room_after(r.prompt.len(), context))))
        .collect();
    let mut serving = Serving {
        requests,
        sampled,
        context,
        end_tokens: model.config.eos_token_id.clone(),
        start: Instant::now(),
        scheduler: Scheduler::new(policy, admission, max_batch, model.cache.pages, demands),
        in_flight: (0..requests.len()).map(|_| None).collect(),
        batch: StepBatch::with_capacity(max_batch, model.batch.table_width),
        chosen: Vec::with_capacity(max_batch),
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
    /// The tokens the last decode step chose, one per row.
    chosen: Vec<u32>,
    first_token_seconds: Vec<f64>,
    generated_tokens: usize,
    finished: F,
}

impl<F: FnMut(Response) -> Result<()>> Serving<'_, F> {
    /// Admission: prefills each admitted prompt into its pages, one at a time. A request that
    /// stops at its first token frees its slot and pages at once, so it admits until none comes.
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

    /// The prompt of `request` into the pages it was given in `slot`, and its first token;
    /// or, for a request preempted earlier, its prompt and the tokens it had generated,
    /// recomputed in one prefill, and its next token.
    fn prefill(&mut self, model: &mut Model, request: usize, slot: usize) -> Result<()> {
        let Request { prompt, max_new_tokens } = &self.requests[request];
        let mut flight = match self.in_flight[request].take() {
            Some(preempted) => InFlight { slot, ..preempted },
            None => InFlight {
                slot,
                tokens: Vec::with_capacity(*max_new_tokens),
                first_token_seconds: 0.0,
                step_logits: Vec::new(),
            },
        };
        if *max_new_tokens == 0 {
            self.in_flight[request] = Some(flight);
            return self.complete(model, slot, Stop::Budget);
        }
        let resumed = !flight.tokens.is_empty();
        // One allocation per admission, not per token.
        let prefix = [&prompt[..], &flight.tokens[..]].concat();
        let block_table = &self.scheduler.running(slot).expect("admitted").block_table;
        model.forward(block_table, &prefix)?;
        if self.sampled.contains(&request) {
            flight.step_logits.push(model.logits_row(0)?);
        }
        let token = model.next_tokens()?[0];
        flight.tokens.push(token);
        if !resumed {
            flight.first_token_seconds = self.start.elapsed().as_secs_f64();
            self.first_token_seconds.push(flight.first_token_seconds);
        }
        let generated = flight.tokens.len();
        self.in_flight[request] = Some(flight);
        match stop_reason(token, &self.end_tokens, generated, *max_new_tokens, prefix.len(), self.context) {
            Some(stop) => self.complete(model, slot, stop),
            None => {
                self.scheduler.start(slot, prefix.len(), token);
                Ok(())
            }
        }
    }

    /// One decode step: a token of every sequence in a slot, each checked against the stop rule.
    fn decode_step(&mut self, model: &mut Model) -> Result<()> {
        self.scheduler.step_batch(&mut self.batch);
        // Pages a preemption gave back (optimistic admission), NaN under --check.
        model.cache.poison_pages(&model.gpu, &self.scheduler.released)?;
        self.scheduler.released.clear();
        model.decode(&self.batch)?;
        for row in 0..self.batch.len() {
            let request = self.request_in_row(row);
            if self.sampled.contains(&request) {
                let logits = model.logits_row(row)?;
                self.in_flight[request].as_mut().expect("running").step_logits.push(logits);
            }
        }
        // Copied out (no allocation), since completing a request uses the model again.
        self.chosen.clear();
        self.chosen.extend_from_slice(model.next_tokens()?);
        for row in 0..self.chosen.len() {
            let token = self.chosen[row];
            let (slot, request) = (self.batch.slots[row] as usize, self.request_in_row(row));
            let flight = self.in_flight[request].as_mut().expect("running");
            flight.tokens.push(token);
            // The token was predicted from the row's position and every one before it.
            let processed = self.batch.positions[row] as usize + 1;
            let max_new_tokens = self.requests[request].max_new_tokens;
            match stop_reason(token, &self.end_tokens, flight.tokens.len(), max_new_tokens, processed, self.context) {
                Some(stop) => self.complete(model, slot, stop)?,
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

    /// A stopped request: its slot and pages back to the scheduler, its response to the caller.
    fn complete(&mut self, model: &mut Model, slot: usize, stop: Stop) -> Result<()> {
        let running = self.scheduler.running(slot).expect("a finished request was running");
        let done = self.in_flight[running.request].take().expect("a finished request was in flight");
        // Every token but the last was fed back, so the cache holds them after the prompt.
        let cached = (self.requests[running.request].prompt.len() + done.tokens.len()).saturating_sub(1);
        let mut cached_kv = Vec::new();
        if self.sampled.contains(&running.request) && !done.tokens.is_empty() {
            for layer in 0..model.cache.layers {
                cached_kv.push(model.cache.gather(&model.gpu, layer, &running.block_table, cached)?);
            }
        }
        model.cache.poison_pages(&model.gpu, &running.block_table)?;
        let request = self.scheduler.finish(slot);
        self.generated_tokens += done.tokens.len();
        (self.finished)(Response {
            request,
            slot: done.slot,
            tokens: done.tokens,
            stop,
            first_token_seconds: done.first_token_seconds,
            step_logits: done.step_logits,
            cached_kv,
        })
    }

    fn summary(self) -> Summary {
        let scheduler = &self.scheduler;
        let rejected = scheduler
            .rejected
            .iter()
            .map(|&request| Rejected { request, pages: scheduler.demand(request).pages })
            .collect();
        let served = (0..self.requests.len()).filter(|r| !scheduler.rejected.contains(r));
        Summary {
            requests: served.clone().count(),
            prompt_tokens: served.map(|r| self.requests[r].prompt.len()).sum(),
            generated_tokens: self.generated_tokens,
            seconds: self.start.elapsed().as_secs_f64(),
            first_token_seconds: self.first_token_seconds,
            decode_steps: self.scheduler.steps,
            peak_active: self.scheduler.peak_active,
            largest_batch: self.scheduler.largest_batch,
            idle_slot_steps: self.scheduler.idle_slot_steps,
            pool_pages: self.scheduler.pool.pages(),
            peak_assigned_pages: self.scheduler.peak_assigned_pages,
            admission_waits: self.scheduler.admission_waits,
            preemptions: self.scheduler.preemptions,
            recomputed_tokens: self.scheduler.recomputed_tokens,
            free_pages: self.scheduler.pool.free_pages(),
            rejected,
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

    // ANCHOR: stats
    /// `--stats`: how the pool was used, and that every page came back.
    pub fn print_stats(&self, page_bytes: usize) {
        let mib = |pages: usize| (pages * page_bytes) as f64 / (1024.0 * 1024.0);
        let pool = self.pool_pages;
        println!("stats   pool: {pool} pages of {PAGE_SIZE} positions ({:.1} MiB)", mib(pool));
        println!("        peak active requests: {}, largest decode batch: {}", self.peak_active, self.largest_batch);
        let share = 100.0 * self.peak_assigned_pages as f64 / pool as f64;
        println!("        peak assigned pages: {} of {pool} ({share:.1}%)", self.peak_assigned_pages);
        println!("        admission waits: {}", self.admission_waits);
        println!("        preemptions: {}, recomputed tokens: {}", self.preemptions, self.recomputed_tokens);
        let leaked = if self.free_pages == pool {
            "none leaked".to_string()
        } else {
            format!("{} LEAKED", pool - self.free_pages)
        };
        println!("        free pages at the end: {} of {pool} ({leaked})", self.free_pages);
    }
    // ANCHOR_END: stats
}
