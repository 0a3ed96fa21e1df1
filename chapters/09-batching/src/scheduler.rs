//! The scheduler: which requests run, in which slot, and what each decode step packs.
//!
//! Requests wait in a FIFO queue. The engine has `max_batch` slots, each one sequence's
//! region of the KV cache; a request is *admitted* into a free slot, where its prompt is
//! prefilled, and then takes part in every decode step until it stops, when its slot is
//! free again. Two policies decide when a free slot is filled:
//!
//! - **static** batching admits a group of up to `max_batch` requests only when every slot
//!   is free, and waits for the whole group to finish: a slot whose request stopped early
//!   stays idle until the slowest request of its group is done;
//! - **continuous** batching refills a slot as soon as its request finishes, so no slot is
//!   idle while a request waits.
//!
//! Nothing here touches the GPU: the engine asks the scheduler what to do, runs it, and
//! reports back what the model produced. That keeps every rule testable on its own.

use std::collections::VecDeque;

/// When free slots are filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Static,
    Continuous,
}

/// A sequence in a slot: its request, the positions its cache holds, and the token that
/// the next decode step feeds in (the last one it generated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub request: usize,
    /// Positions of this slot's cache that are filled: the prompt and the tokens fed back so far.
    pub cached: usize,
    pub last_token: u32,
    /// Decode steps run before it was admitted.
    pub admitted_at: usize,
}

/// Which request held which slot, from the decode step it was admitted before to the one
/// it finished in (a request that stopped at its first token holds it for no step).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Occupancy {
    pub request: usize,
    pub slot: usize,
    pub from_step: usize,
    pub to_step: usize,
}

// ANCHOR: step_batch
/// One decode step's batch, as the GPU receives it: row i feeds token `ids[i]` of the
/// sequence in slot `slots[i]` at position `positions[i]`, and attends to positions
/// `0..=positions[i]` of that slot's cache.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StepBatch {
    pub slots: Vec<u32>,
    pub ids: Vec<u32>,
    pub positions: Vec<u32>,
}

impl StepBatch {
    /// A batch with room for `rows` rows, so that filling it never allocates.
    pub fn with_capacity(rows: usize) -> Self {
        StepBatch {
            slots: Vec::with_capacity(rows),
            ids: Vec::with_capacity(rows),
            positions: Vec::with_capacity(rows),
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}
// ANCHOR_END: step_batch

// ANCHOR: scheduler
pub struct Scheduler {
    policy: Policy,
    /// Requests not yet admitted, oldest first.
    queue: VecDeque<usize>,
    /// What each slot holds: `None` when it is free.
    slots: Vec<Option<Running>>,
    /// Decode steps run so far, and slot-steps in them that held no sequence.
    pub steps: usize,
    pub idle_slot_steps: usize,
    pub peak_active: usize,
    pub largest_batch: usize,
    /// Every finished request's stay in its slot, for `--timeline`.
    pub timeline: Vec<Occupancy>,
}

impl Scheduler {
    /// A scheduler for requests `0..requests`, queued in that order.
    pub fn new(policy: Policy, max_batch: usize, requests: usize) -> Self {
        assert!(max_batch > 0, "at least one slot");
        Scheduler {
            policy,
            queue: (0..requests).collect(),
            slots: vec![None; max_batch],
            steps: 0,
            idle_slot_steps: 0,
            peak_active: 0,
            largest_batch: 0,
            timeline: Vec::new(),
        }
    }

    /// The requests to admit now, oldest first, each with the free slot it gets. The engine
    /// prefills each one and then calls [`Scheduler::start`] (or [`Scheduler::finish`] for a
    /// request that stopped at its first token).
    pub fn admit(&mut self) -> Vec<(usize, usize)> {
        let all_free = self.slots.iter().all(Option::is_none);
        if self.policy == Policy::Static && !all_free {
            return Vec::new(); // a group is still running: wait for all of it
        }
        let free: Vec<usize> = (0..self.slots.len()).filter(|&s| self.slots[s].is_none()).collect();
        let admitted: Vec<(usize, usize)> =
            free.into_iter().map_while(|slot| Some((self.queue.pop_front()?, slot))).collect();
        for &(request, slot) in &admitted {
            // Reserved until `start` or `finish`: a slot is never given to two requests.
            self.slots[slot] = Some(Running { request, cached: 0, last_token: 0, admitted_at: self.steps });
        }
        admitted
    }

    /// The request in `slot` was prefilled: its cache holds `cached` positions and
    /// `first_token` is what it generated from them.
    pub fn start(&mut self, slot: usize, cached: usize, first_token: u32) {
        let running = self.slots[slot].as_mut().expect("start: the slot was admitted");
        running.cached = cached;
        running.last_token = first_token;
        self.peak_active = self.peak_active.max(self.active());
    }

    /// The request in `slot` stopped; the slot is free.
    pub fn finish(&mut self, slot: usize) -> usize {
        let running = self.slots[slot].take().expect("finish: the slot holds a request");
        let (from_step, to_step) = (running.admitted_at, self.steps);
        self.timeline.push(Occupancy { request: running.request, slot, from_step, to_step });
        running.request
    }

    /// Sequences in slots now.
    pub fn active(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    pub fn running(&self, slot: usize) -> Option<&Running> {
        self.slots[slot].as_ref()
    }

    pub fn is_done(&self) -> bool {
        self.queue.is_empty() && self.active() == 0
    }

    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// Fills `batch` with one row per running sequence, in slot order (no allocation once
    /// its vectors have grown to the batch size), and counts the step.
    pub fn step_batch(&mut self, batch: &mut StepBatch) {
        batch.slots.clear();
        batch.ids.clear();
        batch.positions.clear();
        for (slot, running) in self.slots.iter().enumerate() {
            if let Some(running) = running {
                batch.slots.push(slot as u32);
                batch.ids.push(running.last_token);
                batch.positions.push(running.cached as u32);
            }
        }
        self.steps += 1;
        self.idle_slot_steps += self.slots.len() - batch.len();
        self.largest_batch = self.largest_batch.max(batch.len());
    }

    /// After a decode step: the sequence in `slot` cached one more position and generated `token`.
    pub fn advance(&mut self, slot: usize, token: u32) {
        let running = self.slots[slot].as_mut().expect("advance: the slot holds a request");
        running.cached += 1;
        running.last_token = token;
    }
}
// ANCHOR_END: scheduler

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for the randomized workloads.
    struct Random(u64);

    impl Random {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// A request of the simulation: how many tokens it generates before it stops (its budget,
    /// or fewer when an end token comes first).
    struct Simulated {
        prompt: usize,
        generates: usize,
    }

    fn workload(random: &mut Random, requests: usize, mixed: bool) -> Vec<Simulated> {
        (0..requests)
            .map(|_| {
                let budget = if mixed { 1 + random.below(300) as usize } else { 64 };
                let early_stop = random.below(4) == 0;
                let generates = if early_stop { 1 + random.below(budget as u64) as usize } else { budget };
                Simulated { prompt: 1 + random.below(1500) as usize, generates }
            })
            .collect()
    }

    /// What a run did, for the assertions.
    #[derive(Default)]
    struct Trace {
        admitted: Vec<usize>,
        finished: Vec<usize>,
        generated: Vec<usize>,
    }

    /// Runs the engine's loop against a fake model, checking the invariants at every step.
    fn simulate(policy: Policy, max_batch: usize, requests: &[Simulated]) -> (Trace, Scheduler) {
        let mut scheduler = Scheduler::new(policy, max_batch, requests.len());
        let mut trace = Trace { generated: vec![0; requests.len()], ..Default::default() };
        let mut batch = StepBatch::default();
        while !scheduler.is_done() {
            loop {
                let admitted = scheduler.admit();
                if admitted.is_empty() {
                    break;
                }
                for (request, slot) in admitted {
                    trace.admitted.push(request);
                    trace.generated[request] = 1; // the prefill's token
                    if requests[request].generates == 1 {
                        trace.finished.push(scheduler.finish(slot));
                    } else {
                        scheduler.start(slot, requests[request].prompt, 7);
                    }
                }
            }
            if policy == Policy::Continuous && scheduler.waiting() > 0 {
                assert_eq!(scheduler.active(), max_batch, "a slot is idle while a request waits");
            }
            if scheduler.active() == 0 {
                continue; // every admitted request stopped at its first token
            }
            scheduler.step_batch(&mut batch);
            assert!(batch.len() <= max_batch);
            let mut slots = batch.slots.clone();
            slots.dedup();
            assert_eq!(slots.len(), batch.len(), "a slot appears twice in one step");
            for row in 0..batch.len() {
                let slot = batch.slots[row] as usize;
                let request = scheduler.running(slot).unwrap().request;
                assert_eq!(
                    batch.positions[row] as usize,
                    requests[request].prompt + trace.generated[request] - 1,
                    "a row's position is not its sequence's length"
                );
                scheduler.advance(slot, 7);
                trace.generated[request] += 1;
                if trace.generated[request] == requests[request].generates {
                    trace.finished.push(scheduler.finish(slot));
                }
            }
        }
        (trace, scheduler)
    }

    #[test]
    fn every_request_finishes_once_in_fifo_order_in_both_policies() {
        let mut random = Random(0x5eed);
        for policy in [Policy::Static, Policy::Continuous] {
            for max_batch in [1, 3, 32] {
                let requests = workload(&mut random, 2000, true);
                let (trace, _) = simulate(policy, max_batch, &requests);
                assert_eq!(trace.admitted, (0..requests.len()).collect::<Vec<_>>(), "admission is not FIFO");
                let mut finished = trace.finished.clone();
                finished.sort_unstable();
                assert_eq!(finished, (0..requests.len()).collect::<Vec<_>>(), "not every request finished once");
                for (request, simulated) in requests.iter().enumerate() {
                    assert_eq!(trace.generated[request], simulated.generates);
                }
            }
        }
    }

    #[test]
    fn the_timeline_never_puts_two_requests_in_one_slot_at_once() {
        let requests = workload(&mut Random(9), 300, true);
        for policy in [Policy::Static, Policy::Continuous] {
            let (_, scheduler) = simulate(policy, 5, &requests);
            assert_eq!(scheduler.timeline.len(), requests.len());
            for a in &scheduler.timeline {
                assert!(a.from_step <= a.to_step && a.to_step <= scheduler.steps);
                for b in scheduler.timeline.iter().filter(|b| b.slot == a.slot && b.request != a.request) {
                    assert!(a.to_step <= b.from_step || b.to_step <= a.from_step, "{a:?} overlaps {b:?}");
                }
            }
        }
    }

    #[test]
    fn static_batching_admits_a_group_only_when_all_slots_are_free() {
        let mut scheduler = Scheduler::new(Policy::Static, 2, 4);
        assert_eq!(scheduler.admit(), vec![(0, 0), (1, 1)]);
        scheduler.start(0, 5, 1);
        scheduler.start(1, 5, 1);
        scheduler.finish(0);
        assert_eq!(scheduler.admit(), vec![], "slot 0 is free, but request 1 still runs");
        scheduler.finish(1);
        assert_eq!(scheduler.admit(), vec![(2, 0), (3, 1)]);
    }

    #[test]
    fn continuous_batching_refills_a_slot_at_once() {
        let mut scheduler = Scheduler::new(Policy::Continuous, 2, 4);
        assert_eq!(scheduler.admit(), vec![(0, 0), (1, 1)]);
        scheduler.start(0, 5, 1);
        scheduler.start(1, 5, 1);
        assert_eq!(scheduler.finish(1), 1);
        assert_eq!(scheduler.admit(), vec![(2, 1)]);
    }

    #[test]
    fn continuous_batching_leaves_fewer_slots_idle_on_mixed_budgets() {
        let requests = workload(&mut Random(42), 500, true);
        let (_, fixed) = simulate(Policy::Static, 16, &requests);
        let (_, continuous) = simulate(Policy::Continuous, 16, &requests);
        assert!(
            continuous.idle_slot_steps * 4 < fixed.idle_slot_steps,
            "continuous {} idle slot-steps, static {}",
            continuous.idle_slot_steps,
            fixed.idle_slot_steps
        );
        assert!(continuous.steps < fixed.steps, "continuous took {} steps, static {}", continuous.steps, fixed.steps);
        assert_eq!(continuous.largest_batch, 16);
    }

    #[test]
    fn the_step_batch_lists_running_sequences_in_slot_order() {
        let mut scheduler = Scheduler::new(Policy::Continuous, 3, 3);
        scheduler.admit();
        scheduler.start(0, 4, 10);
        scheduler.start(1, 9, 11);
        scheduler.start(2, 2, 12);
        scheduler.finish(1);
        let mut batch = StepBatch::default();
        scheduler.step_batch(&mut batch);
        assert_eq!(batch, StepBatch { slots: vec![0, 2], ids: vec![10, 12], positions: vec![4, 2] });
        assert_eq!(scheduler.idle_slot_steps, 1);
    }
}
