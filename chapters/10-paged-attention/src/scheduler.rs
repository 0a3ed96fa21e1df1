//! The scheduler: which requests run, which pages of the cache they hold, and what each
//! decode step packs.
//!
//! Requests wait in a FIFO queue. A running sequence has one of `max_batch` *slots*, its
//! row in the decode step's batch; since this chapter a slot owns no cache: the sequence's
//! keys and values live in pages of the shared pool, listed in its block table. A request is
//! *admitted* when a slot is free and the credits for its pages fit in the pool (see
//! `page_pool.rs`); its prompt is prefilled into pages taken then, it takes a new page
//! whenever it crosses a page boundary, and it gives back its pages and its credits when it
//! stops. Two policies decide when requests are admitted:
//!
//! - **static** batching admits a group, as many as fit, only when nothing runs, and waits
//!   for the whole group to finish;
//! - **continuous** batching admits the next request as soon as its credits fit, so no
//!   credit is idle while the request at the head of the queue could use it.
//!
//! A request that needs more pages than the whole pool can never run: it is rejected, and
//! the requests behind it go on.
//!
//! Nothing here touches the GPU: the engine asks the scheduler what to do, runs it, and
//! reports back what the model produced. That keeps every rule testable on its own.

use std::collections::VecDeque;

use crate::page_pool::{PAGE_SIZE, PagePool, cache_row, pages_for};

/// When free slots are filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Static,
    Continuous,
}

// ANCHOR: admission
/// What a request reserves when it is admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Credits for the longest sequence it can become, so that it always has room to finish:
    /// no request is ever preempted, but a generous budget holds pages it may never use.
    Conservative,
    /// Only the pages its prefix needs now. A sequence that needs a page when none is free
    /// takes one from the most recently admitted running request, which is *preempted*: its
    /// pages go back, it returns to the front of the queue with the tokens it generated, and
    /// on its next admission its prefix (prompt and tokens) is recomputed by a prefill.
    Optimistic,
}
// ANCHOR_END: admission

// ANCHOR: demand
/// What a request asks of the pool: its prompt's length, and the credits it reserves for
/// the longest sequence it can become (see [`Demand::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    pub prompt: usize,
    pub pages: usize,
}

impl Demand {
    /// A request of `prompt` tokens that generates at most `max_new_tokens` (already capped
    /// at the context). The cache holds every token it processes: the prompt and each
    /// generated token but the last, which is returned without being fed back. So the
    /// longest sequence it can cache is `prompt + max_new_tokens - 1` positions, in whole pages.
    pub fn new(prompt: usize, max_new_tokens: usize) -> Self {
        let positions = prompt + max_new_tokens.saturating_sub(1);
        Demand { prompt, pages: pages_for(positions) }
    }
}
// ANCHOR_END: demand

/// A sequence in a slot: its request, the positions its cache holds, its pages, and the
/// token that the next decode step feeds in (the last one it generated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub request: usize,
    /// Positions of its cache that are filled: the prompt and the tokens fed back so far.
    pub cached: usize,
    pub last_token: u32,
    /// Decode steps run before it was admitted.
    pub admitted_at: usize,
    /// Its pages in order: position p is at offset `p % PAGE_SIZE` of page `block_table[p / PAGE_SIZE]`.
    pub block_table: Vec<u32>,
    /// Credits it reserved: the most pages it may take.
    pub reserved: usize,
    /// Its place in the order of admissions (later admissions are preempted first).
    pub admission: usize,
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
/// sequence in slot `slots[i]` at position `positions[i]`; its key and value go to row
/// `cache_rows[i]` of the pool (page · PAGE_SIZE + offset: what vLLM calls the slot
/// mapping), and it attends to positions `0..=positions[i]` through its block table, row i
/// of `block_tables` (`table_width` entries, the pages it holds first).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StepBatch {
    pub slots: Vec<u32>,
    pub ids: Vec<u32>,
    pub positions: Vec<u32>,
    pub cache_rows: Vec<u32>,
    pub block_tables: Vec<u32>,
    /// Entries per row of `block_tables`: the most pages a sequence can hold.
    pub table_width: usize,
}

impl StepBatch {
    /// A batch with room for `rows` rows of block tables `table_width` wide, so that
    /// filling it never allocates.
    pub fn with_capacity(rows: usize, table_width: usize) -> Self {
        StepBatch {
            slots: Vec::with_capacity(rows),
            ids: Vec::with_capacity(rows),
            positions: Vec::with_capacity(rows),
            cache_rows: Vec::with_capacity(rows),
            block_tables: Vec::with_capacity(rows * table_width),
            table_width,
        }
    }

    /// A batch of one sequence: `token` at `position`, with the pages of `block_table`.
    pub fn single(token: u32, position: usize, block_table: &[u32], table_width: usize) -> Self {
        let mut batch = StepBatch::with_capacity(1, table_width);
        batch.push(0, token, position, block_table);
        batch
    }

    /// Appends a row: the sequence in `slot` feeds `token` at `position`, whose page its
    /// block table already holds.
    fn push(&mut self, slot: usize, token: u32, position: usize, block_table: &[u32]) {
        assert!(block_table.len() <= self.table_width, "a block table is wider than the batch's");
        self.slots.push(slot as u32);
        self.ids.push(token);
        self.positions.push(position as u32);
        self.cache_rows.push(cache_row(block_table, position));
        self.block_tables.extend_from_slice(block_table);
        // The entries past its pages are never read (attention stops at the row's length).
        self.block_tables.resize(self.slots.len() * self.table_width, 0);
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
    admission: Admission,
    /// What each request asks of the pool.
    demands: Vec<Demand>,
    /// Requests not yet admitted, oldest first.
    queue: VecDeque<usize>,
    /// What each slot holds: `None` when it is free.
    slots: Vec<Option<Running>>,
    pub pool: PagePool,
    /// Decode steps run so far, and slot-steps in them that held no sequence.
    pub steps: usize,
    pub idle_slot_steps: usize,
    pub peak_active: usize,
    pub largest_batch: usize,
    pub peak_assigned_pages: usize,
    /// Requests that reached the head of the queue and had to wait for credits.
    pub admission_waits: usize,
    /// The request now waiting at the head of the queue for credits, if any (counted once).
    waiting_head: Option<usize>,
    /// Requests that need more pages than the pool holds, in the order they were refused.
    pub rejected: Vec<usize>,
    /// Tokens each request generated before it was last preempted (0 if never): its prefix
    /// is the prompt and these, recomputed when it is admitted again.
    generated: Vec<usize>,
    /// Admissions so far, and preemptions, and prefix tokens prefilled again on resuming.
    admissions: usize,
    pub preemptions: usize,
    pub recomputed_tokens: usize,
    /// Pages given back by preemptions since the engine last took them (to poison under `--check`).
    pub released: Vec<u32>,
    /// Every finished request's stay in its slot, for `--timeline`.
    pub timeline: Vec<Occupancy>,
}

impl Scheduler {
    /// A scheduler for requests `0..demands.len()`, queued in that order, in `max_batch`
    /// slots and a pool of `pages` pages.
    pub fn new(policy: Policy, admission: Admission, max_batch: usize, pages: usize, demands: Vec<Demand>) -> Self {
        assert!(max_batch > 0, "at least one slot");
        Scheduler {
            policy,
            admission,
            generated: vec![0; demands.len()],
            admissions: 0,
            preemptions: 0,
            recomputed_tokens: 0,
            released: Vec::new(),
            queue: (0..demands.len()).collect(),
            demands,
            slots: vec![None; max_batch],
            pool: PagePool::new(pages),
            steps: 0,
            idle_slot_steps: 0,
            peak_active: 0,
            largest_batch: 0,
            peak_assigned_pages: 0,
            admission_waits: 0,
            waiting_head: None,
            rejected: Vec::new(),
            timeline: Vec::new(),
        }
    }

    // ANCHOR: admit
    /// The requests to admit now, oldest first, each with the free slot it gets and the
    /// pages of its prompt in its block table. The engine prefills each one and then calls
    /// [`Scheduler::start`] (or [`Scheduler::finish`] for a request that stopped at its
    /// first token). FIFO: when the request at the head of the queue does not fit, the ones
    /// behind it wait too, even if they would fit (they would otherwise pass it forever).
    pub fn admit(&mut self) -> Vec<(usize, usize)> {
        let all_free = self.slots.iter().all(Option::is_none);
        if self.policy == Policy::Static && !all_free {
            return Vec::new(); // a group is still running: wait for all of it
        }
        let mut admitted = Vec::new();
        while let Some(slot) = self.slots.iter().position(Option::is_none) {
            let Some(request) = self.next_that_can_run() else { break };
            let (demand, prefix) = (self.demands[request], self.prefix(request));
            let credits = match self.admission {
                Admission::Conservative => demand.pages,
                Admission::Optimistic => pages_for(prefix),
            };
            if !self.pool.reserve(credits) {
                if self.waiting_head != Some(request) {
                    self.waiting_head = Some(request);
                    self.admission_waits += 1;
                }
                break;
            }
            self.queue.pop_front();
            if self.generated[request] > 0 {
                self.recomputed_tokens += prefix;
            }
            let mut block_table = Vec::with_capacity(demand.pages);
            block_table.extend((0..pages_for(prefix)).map(|_| self.pool.take()));
            let (admitted_at, admission) = (self.steps, self.admissions);
            self.admissions += 1;
            // Held until `finish`: a slot is never given to two requests.
            let running =
                Running { request, cached: 0, last_token: 0, admitted_at, block_table, reserved: credits, admission };
            self.slots[slot] = Some(running);
            self.peak_assigned_pages = self.peak_assigned_pages.max(self.pool.assigned());
            admitted.push((request, slot));
        }
        admitted
    }

    /// The request at the head of the queue, after refusing those that could never fit.
    fn next_that_can_run(&mut self) -> Option<usize> {
        while let Some(&request) = self.queue.front() {
            if self.demands[request].pages <= self.pool.pages() {
                return Some(request);
            }
            self.queue.pop_front();
            self.rejected.push(request);
        }
        None
    }
    // ANCHOR_END: admit

    /// What request `request` asked of the pool.
    pub fn demand(&self, request: usize) -> Demand {
        self.demands[request]
    }

    /// Positions a prefill of `request` fills: its prompt, and the tokens it generated
    /// before it was preempted, if it was.
    pub fn prefix(&self, request: usize) -> usize {
        self.demands[request].prompt + self.generated[request]
    }

    /// The request in `slot` was prefilled: its cache holds `cached` positions and
    /// `first_token` is what it generated from them.
    pub fn start(&mut self, slot: usize, cached: usize, first_token: u32) {
        let running = self.slots[slot].as_mut().expect("start: the slot was admitted");
        running.cached = cached;
        running.last_token = first_token;
        self.peak_active = self.peak_active.max(self.active());
    }

    /// The request in `slot` stopped; the slot is free, and its pages and credits are back.
    pub fn finish(&mut self, slot: usize) -> usize {
        let mut running = self.slots[slot].take().expect("finish: the slot holds a request");
        self.pool.release(&mut running.block_table, running.reserved);
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

    /// Whether every request has finished or been rejected.
    pub fn is_done(&self) -> bool {
        self.queue.is_empty() && self.active() == 0
    }

    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    // ANCHOR: step_batch_fill
    /// Fills `batch` with one row per running sequence, in slot order (no allocation: its
    /// vectors have room for every slot), and counts the step. A sequence whose next
    /// position starts a page takes a page first, covered by its credits.
    pub fn step_batch(&mut self, batch: &mut StepBatch) {
        if self.admission == Admission::Optimistic {
            self.make_room();
        }
        batch.slots.clear();
        batch.ids.clear();
        batch.positions.clear();
        batch.cache_rows.clear();
        batch.block_tables.clear();
        for (slot, running) in self.slots.iter_mut().enumerate() {
            if let Some(running) = running {
                if running.cached == running.block_table.len() * PAGE_SIZE {
                    running.block_table.push(self.pool.take());
                }
                batch.push(slot, running.last_token, running.cached, &running.block_table);
            }
        }
        self.peak_assigned_pages = self.peak_assigned_pages.max(self.pool.assigned());
        self.steps += 1;
        self.idle_slot_steps += self.slots.len() - batch.len();
        self.largest_batch = self.largest_batch.max(batch.len());
    }
    // ANCHOR_END: step_batch_fill

    // ANCHOR: make_room
    /// Optimistic admission, before a step: a credit for every sequence whose next position
    /// starts a page, preempting the latest admitted until one is free (which is the
    /// sequence itself when it is the latest). The oldest is therefore never preempted for a
    /// younger one, and a request that fits the pool alone can always finish once it is the
    /// oldest: no livelock. No allocation: this runs before every decode step.
    fn make_room(&mut self) {
        for slot in 0..self.slots.len() {
            let needs_credit = self.slots[slot]
                .as_ref()
                .is_some_and(|r| r.cached == r.block_table.len() * PAGE_SIZE && r.block_table.len() == r.reserved);
            if !needs_credit {
                continue;
            }
            while self.slots[slot].is_some() && !self.pool.reserve(1) {
                self.preempt_latest();
            }
            if let Some(running) = self.slots[slot].as_mut() {
                running.reserved += 1;
            }
        }
    }

    /// Preempts the most recently admitted running request: its pages and credits go back,
    /// and it waits at the front of the queue with the tokens it generated.
    fn preempt_latest(&mut self) {
        let slot = (0..self.slots.len())
            .filter(|&s| self.slots[s].is_some())
            .max_by_key(|&s| self.slots[s].as_ref().map(|r| r.admission))
            .expect("a sequence needs a page, so one is running");
        let mut running = self.slots[slot].take().expect("running");
        // It cached the prompt and every token but its last, which it had not fed back yet.
        self.generated[running.request] = running.cached + 1 - self.demands[running.request].prompt;
        self.released.extend_from_slice(&running.block_table);
        self.pool.release(&mut running.block_table, running.reserved);
        self.queue.push_front(running.request);
        self.preemptions += 1;
    }
    // ANCHOR_END: make_room

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
    use std::collections::HashSet;

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

    /// A request of the simulation: its prompt, its budget, and how many tokens it generates
    /// before it stops (its budget, or fewer when an end token comes first).
    struct Simulated {
        prompt: usize,
        budget: usize,
        generates: usize,
    }

    fn workload(random: &mut Random, requests: usize, mixed: bool) -> Vec<Simulated> {
        (0..requests)
            .map(|_| {
                let budget = if mixed { 1 + random.below(300) as usize } else { 64 };
                let early_stop = random.below(4) == 0;
                let generates = if early_stop { 1 + random.below(budget as u64) as usize } else { budget };
                Simulated { prompt: 1 + random.below(1500) as usize, budget, generates }
            })
            .collect()
    }

    fn demands(requests: &[Simulated]) -> Vec<Demand> {
        requests.iter().map(|r| Demand::new(r.prompt, r.budget)).collect()
    }

    /// What a run did, for the assertions.
    #[derive(Default)]
    struct Trace {
        admitted: Vec<usize>,
        finished: Vec<usize>,
        generated: Vec<usize>,
    }

    /// The invariants of the pool at any moment: no page in two block tables, never more
    /// pages held than the pool, every sequence within its credits, and the books balanced.
    fn check_pool(scheduler: &Scheduler) {
        let mut owned = HashSet::new();
        let mut reserved = 0;
        for running in scheduler.slots.iter().flatten() {
            assert!(running.block_table.len() <= running.reserved, "a sequence holds more pages than it reserved");
            assert!(running.block_table.len() * PAGE_SIZE >= running.cached, "a cached position has no page");
            for &page in &running.block_table {
                assert!((page as usize) < scheduler.pool.pages(), "page {page} is outside the pool");
                assert!(owned.insert(page), "page {page} is owned twice");
            }
            reserved += running.reserved;
        }
        assert!(owned.len() <= scheduler.pool.pages());
        assert_eq!(owned.len(), scheduler.pool.assigned(), "the free list disagrees with the block tables");
        assert_eq!(reserved + scheduler.pool.unreserved(), scheduler.pool.pages(), "credits were lost or made up");
    }

    /// Runs the engine's loop against a fake model, checking the invariants at every step.
    fn simulate(policy: Policy, max_batch: usize, pages: usize, requests: &[Simulated]) -> (Trace, Scheduler) {
        simulate_with(policy, Admission::Conservative, max_batch, pages, requests)
    }

    fn simulate_with(
        policy: Policy,
        admission: Admission,
        max_batch: usize,
        pages: usize,
        requests: &[Simulated],
    ) -> (Trace, Scheduler) {
        let mut scheduler = Scheduler::new(policy, admission, max_batch, pages, demands(requests));
        let mut trace = Trace { generated: vec![0; requests.len()], ..Default::default() };
        let table_width = pages_for(1500 + 300);
        let mut batch = StepBatch::with_capacity(max_batch, table_width);
        // Every request takes at most its budget's steps: more would mean a livelock.
        let step_bound: usize = requests.iter().map(|r| r.generates).sum::<usize>() + 1;
        while !scheduler.is_done() {
            loop {
                let admitted = scheduler.admit();
                if admitted.is_empty() {
                    break;
                }
                for (request, slot) in admitted {
                    trace.admitted.push(request);
                    // A preempted request resumes with exactly the tokens it had.
                    let prefix = requests[request].prompt + trace.generated[request];
                    assert_eq!(scheduler.prefix(request), prefix, "request {request} resumed with other tokens");
                    trace.generated[request] += 1; // the prefill's token
                    if trace.generated[request] == requests[request].generates {
                        trace.finished.push(scheduler.finish(slot));
                    } else {
                        scheduler.start(slot, prefix, 7);
                    }
                }
            }
            check_pool(&scheduler);
            if let Some(&head) = scheduler.queue.front() {
                let free_slot = scheduler.slots.iter().any(Option::is_none);
                let credits = match admission {
                    Admission::Conservative => scheduler.demands[head].pages,
                    Admission::Optimistic => pages_for(scheduler.prefix(head)),
                };
                let fits = credits <= scheduler.pool.unreserved();
                if policy == Policy::Continuous {
                    assert!(!(free_slot && fits), "request {head} fits and a slot is free, but it waits");
                }
                assert!(scheduler.active() > 0, "request {head} waits with nothing running: a deadlock");
            }
            if scheduler.active() == 0 {
                continue; // every admitted request stopped at its first token
            }
            scheduler.step_batch(&mut batch);
            assert!(scheduler.steps <= step_bound, "more steps than the requests' tokens");
            check_pool(&scheduler);
            assert!(batch.len() <= max_batch);
            let mut slots = batch.slots.clone();
            slots.dedup();
            assert_eq!(slots.len(), batch.len(), "a slot appears twice in one step");
            for row in 0..batch.len() {
                let slot = batch.slots[row] as usize;
                let running = scheduler.running(slot).unwrap();
                let request = running.request;
                let position = batch.positions[row] as usize;
                assert_eq!(position, requests[request].prompt + trace.generated[request] - 1, "wrong position");
                let table = &batch.block_tables[row * table_width..][..running.block_table.len()];
                assert_eq!(table, running.block_table.as_slice(), "the batch's block table is not the sequence's");
                let page = running.block_table[position / PAGE_SIZE] as usize;
                assert_eq!(batch.cache_rows[row] as usize, page * PAGE_SIZE + position % PAGE_SIZE, "wrong cache row");
                scheduler.advance(slot, 7);
                trace.generated[request] += 1;
                if trace.generated[request] == requests[request].generates {
                    trace.finished.push(scheduler.finish(slot));
                }
            }
        }
        (trace, scheduler)
    }

    /// Each request's first admission, in order.
    fn first_admissions(admitted: &[usize]) -> Vec<usize> {
        let mut seen = HashSet::new();
        admitted.iter().copied().filter(|&r| seen.insert(r)).collect()
    }

    #[test]
    fn every_request_that_fits_finishes_once_in_fifo_order_and_every_page_comes_back() {
        let mut random = Random(0x5eed);
        for admission in [Admission::Conservative, Admission::Optimistic] {
            for policy in [Policy::Static, Policy::Continuous] {
                // From one page (almost every request rejected) to more than the workload needs.
                for (max_batch, pages) in [(1, 1), (3, 20), (32, 60), (32, 300), (8, 5000)] {
                    let requests = workload(&mut random, 2000, true);
                    check_run(policy, admission, max_batch, pages, &requests);
                }
            }
        }
    }

    /// One randomized run's assertions: FIFO, rejection, every request finished once with
    /// its tokens, every page and credit back.
    fn check_run(policy: Policy, admission: Admission, max_batch: usize, pages: usize, requests: &[Simulated]) {
        let (trace, scheduler) = simulate_with(policy, admission, max_batch, pages, requests);
        let fits = |r: &Simulated| Demand::new(r.prompt, r.budget).pages <= pages;
        let runnable: Vec<usize> = (0..requests.len()).filter(|&i| fits(&requests[i])).collect();
        let rejected: Vec<usize> = (0..requests.len()).filter(|&i| !fits(&requests[i])).collect();
        assert_eq!(first_admissions(&trace.admitted), runnable, "admission is not FIFO among the requests that fit");
        if admission == Admission::Conservative {
            assert_eq!(scheduler.preemptions, 0, "conservative admission preempted");
        }
        assert_eq!(scheduler.rejected, rejected, "not exactly the requests larger than the pool were rejected");
        let mut finished = trace.finished.clone();
        finished.sort_unstable();
        assert_eq!(finished, runnable, "not every admitted request finished once");
        for &request in &runnable {
            assert_eq!(trace.generated[request], requests[request].generates);
        }
        assert_eq!(scheduler.pool.free_pages(), pages, "pages leaked");
        assert_eq!(scheduler.pool.unreserved(), pages, "credits leaked");
        assert!(scheduler.peak_assigned_pages <= pages);
    }

    #[test]
    fn optimistic_admission_fills_a_small_pool_and_pays_with_preemptions() {
        // Budgets of 300 that mostly stop early: conservative admission reserves for 300.
        let mut random = Random(77);
        let requests: Vec<Simulated> = (0..300)
            .map(|_| {
                let early = random.below(5) != 0;
                let generates = if early { 20 + random.below(80) as usize } else { 300 };
                Simulated { prompt: 20 + random.below(200) as usize, budget: 300, generates }
            })
            .collect();
        let (_, conservative) = simulate_with(Policy::Continuous, Admission::Conservative, 64, 200, &requests);
        let (_, optimistic) = simulate_with(Policy::Continuous, Admission::Optimistic, 64, 200, &requests);
        assert_eq!(conservative.preemptions, 0);
        assert!(optimistic.preemptions > 0, "the small pool never preempted");
        assert!(optimistic.recomputed_tokens > 0);
        assert!(
            optimistic.peak_active > conservative.peak_active,
            "optimistic ran {} at once, conservative {}",
            optimistic.peak_active,
            conservative.peak_active
        );
        assert!(optimistic.steps < conservative.steps, "{} steps against {}", optimistic.steps, conservative.steps);
    }

    #[test]
    fn optimistic_admission_preempts_the_latest_admitted_and_requeues_it_first() {
        // Two requests of 16-token prompts in a pool of 2 pages: both fit, until both need a second page.
        let demands = vec![Demand::new(16, 10), Demand::new(16, 10), Demand::new(16, 10)];
        let mut scheduler = Scheduler::new(Policy::Continuous, Admission::Optimistic, 4, 2, demands);
        assert_eq!(scheduler.admit(), vec![(0, 0), (1, 1)]);
        scheduler.start(0, 16, 5);
        scheduler.start(1, 16, 6);
        let mut batch = StepBatch::with_capacity(4, 2);
        scheduler.step_batch(&mut batch);
        assert_eq!(scheduler.preemptions, 1);
        assert_eq!(batch.slots, vec![0], "request 1, admitted last, made room");
        assert_eq!(scheduler.queue.iter().copied().collect::<Vec<_>>(), vec![1, 2], "preempted to the front");
        assert_eq!(scheduler.prefix(1), 17, "its prompt and the one token it generated");
        assert_eq!(scheduler.released.len(), 1);
    }

    #[test]
    fn a_small_pool_makes_requests_wait_and_a_large_one_does_not() {
        let requests = workload(&mut Random(3), 200, true);
        let (_, small) = simulate(Policy::Continuous, 32, 300, &requests);
        assert!(small.admission_waits > 50, "only {} waits in a pool of 300 pages", small.admission_waits);
        assert!(small.peak_assigned_pages > 200, "the pool was not used: {} pages", small.peak_assigned_pages);
        let (_, large) = simulate(Policy::Continuous, 32, 1_000_000, &requests);
        assert_eq!(large.admission_waits, 0);
        assert_eq!(large.largest_batch, 32);
    }

    #[test]
    fn the_timeline_never_puts_two_requests_in_one_slot_at_once() {
        let requests = workload(&mut Random(9), 300, true);
        for policy in [Policy::Static, Policy::Continuous] {
            let (_, scheduler) = simulate(policy, 5, 400, &requests);
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
    fn a_request_reserves_its_longest_cached_sequence_in_pages() {
        // 20 prompt tokens and 13 generated: 32 positions cached, the last token never fed back.
        assert_eq!(Demand::new(20, 13), Demand { prompt: 20, pages: 2 });
        assert_eq!(Demand::new(20, 14).pages, 3);
        assert_eq!(Demand::new(16, 1).pages, 1);
        assert_eq!(Demand::new(16, 0).pages, 1, "a budget of 0 still holds its prompt");
    }

    #[test]
    fn static_batching_admits_a_group_only_when_nothing_runs() {
        let mut scheduler =
            Scheduler::new(Policy::Static, Admission::Conservative, 2, 100, vec![Demand::new(5, 10); 4]);
        assert_eq!(scheduler.admit(), vec![(0, 0), (1, 1)]);
        scheduler.start(0, 5, 1);
        scheduler.start(1, 5, 1);
        scheduler.finish(0);
        assert_eq!(scheduler.admit(), vec![], "slot 0 is free, but request 1 still runs");
        scheduler.finish(1);
        assert_eq!(scheduler.admit(), vec![(2, 0), (3, 1)]);
    }

    #[test]
    fn continuous_batching_admits_as_soon_as_credits_come_back() {
        // Each request reserves 2 pages of a pool of 4: two fit, the third waits for credits.
        let mut scheduler =
            Scheduler::new(Policy::Continuous, Admission::Conservative, 8, 4, vec![Demand::new(20, 10); 3]);
        assert_eq!(scheduler.admit(), vec![(0, 0), (1, 1)]);
        assert_eq!(scheduler.admission_waits, 1);
        scheduler.start(0, 20, 1);
        scheduler.start(1, 20, 1);
        assert_eq!(scheduler.admit(), vec![], "no credits");
        assert_eq!(scheduler.admission_waits, 1, "the same request waiting is one wait");
        assert_eq!(scheduler.finish(1), 1);
        assert_eq!(scheduler.admit(), vec![(2, 1)]);
    }

    #[test]
    fn a_request_larger_than_the_pool_is_rejected_and_the_others_run() {
        let demands = vec![Demand::new(10, 5), Demand::new(100, 100), Demand::new(10, 5)];
        let mut scheduler = Scheduler::new(Policy::Continuous, Admission::Conservative, 4, 8, demands);
        assert_eq!(scheduler.admit(), vec![(0, 0), (2, 1)]);
        assert_eq!(scheduler.rejected, vec![1]);
    }

    #[test]
    fn continuous_batching_leaves_fewer_slots_idle_on_mixed_budgets() {
        let requests = workload(&mut Random(42), 500, true);
        let (_, fixed) = simulate(Policy::Static, 16, 1_000_000, &requests);
        let (_, continuous) = simulate(Policy::Continuous, 16, 1_000_000, &requests);
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
    fn the_step_batch_lists_running_sequences_in_slot_order_with_their_pages() {
        let mut scheduler =
            Scheduler::new(Policy::Continuous, Admission::Conservative, 3, 100, vec![Demand::new(16, 8); 3]);
        scheduler.admit();
        scheduler.start(0, 16, 10);
        scheduler.start(1, 16, 11);
        scheduler.start(2, 16, 12);
        scheduler.finish(1);
        let mut batch = StepBatch::with_capacity(3, 4);
        scheduler.step_batch(&mut batch);
        // Position 16 starts each sequence's second page: one page taken for each.
        let tables: Vec<&Vec<u32>> = [0, 2].iter().map(|&s| &scheduler.running(s).unwrap().block_table).collect();
        assert_eq!(tables.iter().map(|t| t.len()).collect::<Vec<_>>(), vec![2, 2]);
        assert_eq!(batch.slots, vec![0, 2]);
        assert_eq!(batch.ids, vec![10, 12]);
        assert_eq!(batch.positions, vec![16, 16]);
        assert_eq!(batch.cache_rows, vec![tables[0][1] * 16, tables[1][1] * 16]);
        assert_eq!(batch.block_tables, [tables[0][..].to_vec(), vec![0, 0], tables[1].to_vec(), vec![0, 0]].concat());
        assert_eq!(scheduler.idle_slot_steps, 1);
    }
}
