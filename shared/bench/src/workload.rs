//! The benchmark's workloads, written once to a JSON file that every measured system reads
//! (our chapters through this crate, transformers through `hf_bench.py`), so that all of
//! them run exactly the same requests.
//!
//! Prompts are token ids, not text: speed does not depend on which tokens they are, and
//! ids need no tokenizer. Every id is an ordinary token of Llama 3's vocabulary (below
//! 128,000, where the special tokens begin), and every request generates exactly its
//! budget: the systems are told to ignore end tokens, so a run's work is fixed.
//!
//! One workload is the exception, and is not in the file: [`early_stopping`], whose requests
//! are meant to stop at an end token long before their budgets, for chapter 10's admission
//! rules. Only our engine runs it, on the synthetic checkpoint, whose planted rule decides
//! which prompts stop (see `llama_reference::synth::circuit`).

use anyhow::{Context, Result};
use llama_reference::synth::circuit::{BEGIN_OF_TEXT, DOUBLE_NEWLINE, QUIET_BELOW, ROLE_TOKENS};
use serde::{Deserialize, Serialize};

/// Generated tokens per sequence in the single-sequence decode measurement.
pub const SINGLE_PROMPT_TOKENS: usize = 32;
pub const SINGLE_NEW_TOKENS: usize = 256;
/// The prefill measurement: one prompt that leaves room for one token in a 2,048 context.
pub const PREFILL_TOKENS: usize = 2047;
/// Concurrent requests of the throughput measurement, each a prompt of 128 tokens and 128 generated.
pub const CONCURRENCY: [usize; 4] = [8, 32, 128, 256];
pub const CONCURRENT_PROMPT_TOKENS: usize = 128;
pub const CONCURRENT_NEW_TOKENS: usize = 128;
/// The mixed workload: this many requests, prompt lengths and budgets drawn uniformly from the ranges.
pub const MIXED_REQUESTS: usize = 64;
pub const MIXED_PROMPT_TOKENS: (usize, usize) = (16, 512);
pub const MIXED_NEW_TOKENS: (usize, usize) = (16, 256);
/// Ids are drawn below this: the first special token of Llama 3.
const ORDINARY_TOKENS: u64 = 128_000;
/// The early-stopping workload: this many requests, each with this budget, prompt lengths
/// drawn uniformly from the range; every [`LONG_EVERY`]th request, from the first, is long.
pub const EARLY_STOPPING_REQUESTS: usize = 64;
pub const EARLY_STOPPING_NEW_TOKENS: usize = 512;
pub const EARLY_STOPPING_PROMPT_TOKENS: (usize, usize) = (64, 256);
/// A fifth of the requests run to their budget (13 of 64), spread through the queue.
pub const LONG_EVERY: usize = 5;

#[derive(Serialize, Deserialize, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub new_tokens: usize,
}

/// Requests submitted together, all at the start.
#[derive(Serialize, Deserialize)]
pub struct Batch {
    pub name: String,
    pub requests: Vec<Request>,
}

#[derive(Serialize, Deserialize)]
pub struct Workloads {
    pub seed: u64,
    pub single: Request,
    pub prefill: Request,
    /// One batch per entry of [`CONCURRENCY`], then the mixed one.
    pub batches: Vec<Batch>,
}

impl Workloads {
    pub fn generate(seed: u64) -> Self {
        let mut random = XorShift::new(seed);
        let mut request = |prompt_tokens: usize, new_tokens: usize| Request {
            prompt: (0..prompt_tokens).map(|_| random.below(ORDINARY_TOKENS) as u32).collect(),
            new_tokens,
        };
        let single = request(SINGLE_PROMPT_TOKENS, SINGLE_NEW_TOKENS);
        let prefill = request(PREFILL_TOKENS, 1);
        let mut batches: Vec<Batch> = CONCURRENCY
            .iter()
            .map(|&n| Batch {
                name: format!("concurrent_{n}"),
                requests: (0..n).map(|_| request(CONCURRENT_PROMPT_TOKENS, CONCURRENT_NEW_TOKENS)).collect(),
            })
            .collect();
        let mut sizes = XorShift::new(seed ^ 0x5eed);
        let mixed = (0..MIXED_REQUESTS)
            .map(|_| {
                let prompt = sizes.between(MIXED_PROMPT_TOKENS);
                let budget = sizes.between(MIXED_NEW_TOKENS);
                request(prompt, budget)
            })
            .collect();
        batches.push(Batch { name: "mixed".into(), requests: mixed });
        Workloads { seed, single, prefill, batches }
    }

    pub fn read(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not a workloads file", path.display()))
    }
}

/// A request of the early-stopping workload, and whether the synthetic model ends it early.
pub struct Stopping {
    pub request: Request,
    pub stops_early: bool,
}

/// The early-stopping workload of `seed`: [`EARLY_STOPPING_REQUESTS`] requests of budget
/// [`EARLY_STOPPING_NEW_TOKENS`], each prompt `<|begin_of_text|>`, a body, and `"\n\n"`.
/// Under the synthetic model's rule each next token echoes the farthest loud token 5, 6 or
/// 40 positions back (ids from [`QUIET_BELOW`] on are loud), and with none there steps from
/// the current token: from `"\n\n"`, down the quiet path to `<|eot_id|>`. So an early
/// request's body is quiet (ids `1..QUIET_BELOW`, never `"\n\n"` itself): it stops after
/// `END_AFTER` (20) tokens. A long one's body is loud (ids `QUIET_BELOW..128000`, never the
/// chat format's quiet role words): the model echoes it for its whole budget.
pub fn early_stopping(seed: u64) -> Vec<Stopping> {
    let mut random = XorShift::new(seed ^ 0x570b);
    (0..EARLY_STOPPING_REQUESTS)
        .map(|index| {
            let stops_early = !index.is_multiple_of(LONG_EVERY);
            let body = random.between(EARLY_STOPPING_PROMPT_TOKENS) - 2;
            let mut prompt = Vec::with_capacity(body + 2);
            prompt.push(BEGIN_OF_TEXT);
            prompt.extend((0..body).map(|_| if stops_early { random.quiet() } else { random.loud() }));
            prompt.push(DOUBLE_NEWLINE);
            Stopping { request: Request { prompt, new_tokens: EARLY_STOPPING_NEW_TOKENS }, stops_early }
        })
        .collect()
}

/// A small, fast pseudo-random generator (Marsaglia's xorshift64): the same seed gives the
/// same workloads on every machine.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    /// A whole number in `low..=high`.
    fn between(&mut self, (low, high): (usize, usize)) -> usize {
        low + self.below((high - low + 1) as u64) as usize
    }

    /// A quiet id of the synthetic rule other than `"\n\n"`: one of `1..QUIET_BELOW` but 271.
    fn quiet(&mut self) -> u32 {
        let id = 1 + self.below(QUIET_BELOW as u64 - 2) as u32;
        if id >= DOUBLE_NEWLINE { id + 1 } else { id }
    }

    /// A loud id of the synthetic rule: one of `QUIET_BELOW..128000` but the role words.
    fn loud(&mut self) -> u32 {
        loop {
            let id = (QUIET_BELOW as u64 + self.below(ORDINARY_TOKENS - QUIET_BELOW as u64)) as u32;
            if !ROLE_TOKENS.contains(&id) {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_have_the_stated_shapes() {
        let w = Workloads::generate(7);
        assert_eq!((w.single.prompt.len(), w.single.new_tokens), (32, 256));
        assert_eq!(w.prefill.prompt.len(), 2047);
        let sizes: Vec<usize> = w.batches.iter().map(|b| b.requests.len()).collect();
        assert_eq!(sizes, vec![8, 32, 128, 256, MIXED_REQUESTS]);
        for request in &w.batches[2].requests {
            assert_eq!((request.prompt.len(), request.new_tokens), (128, 128));
        }
        let mixed = &w.batches[4].requests;
        assert!(mixed.iter().all(|r| (16..=512).contains(&r.prompt.len()) && (16..=256).contains(&r.new_tokens)));
        // Mixed means mixed: the sizes are not all one.
        assert!(mixed.iter().any(|r| r.prompt.len() != mixed[0].prompt.len()));
        let ids = w.batches.iter().flat_map(|b| &b.requests).flat_map(|r| &r.prompt);
        assert!(ids.clone().all(|&id| (id as u64) < ORDINARY_TOKENS));
    }

    #[test]
    fn early_stopping_prompts_are_quiet_or_loud_and_end_with_a_double_newline() {
        let requests = early_stopping(7);
        assert_eq!(requests.len(), 64);
        assert_eq!(requests.iter().filter(|r| !r.stops_early).count(), 13);
        for Stopping { request, stops_early } in &requests {
            let prompt = &request.prompt;
            assert!((64..=256).contains(&prompt.len()) && request.new_tokens == 512);
            assert_eq!((prompt[0], prompt[prompt.len() - 1]), (BEGIN_OF_TEXT, DOUBLE_NEWLINE));
            let body = &prompt[1..prompt.len() - 1];
            if *stops_early {
                assert!(body.iter().all(|&id| (1..QUIET_BELOW).contains(&id) && id != DOUBLE_NEWLINE));
            } else {
                assert!(body.iter().all(|&id| (QUIET_BELOW..128_000).contains(&id) && !ROLE_TOKENS.contains(&id)));
            }
        }
        assert!(requests.iter().any(|r| r.request.prompt.len() != requests[0].request.prompt.len()));
        assert_eq!(early_stopping(7)[3].request.prompt, requests[3].request.prompt);
        assert_ne!(early_stopping(8)[3].request.prompt, requests[3].request.prompt);
    }

    #[test]
    fn the_synthetic_rule_stops_every_early_request_and_no_long_one() {
        use llama_reference::LlamaConfig;
        use llama_reference::config::LLAMA_3_2_1B_CONFIG_JSON;
        use llama_reference::synth::Circuit;
        use llama_reference::synth::circuit::{END_AFTER, END_OF_TURN};
        let config = LlamaConfig::from_json(LLAMA_3_2_1B_CONFIG_JSON).unwrap();
        for (model_seed, workload_seed) in [(20261201, 20261201), (1, 2)] {
            let circuit = Circuit::new(&config, model_seed).unwrap();
            for Stopping { request, stops_early } in early_stopping(workload_seed) {
                let tokens = circuit.greedy(&request.prompt, request.new_tokens, &[END_OF_TURN]);
                if stops_early {
                    assert_eq!((tokens.len(), tokens.last()), (END_AFTER, Some(&END_OF_TURN)));
                } else {
                    assert_eq!(tokens.len(), request.new_tokens);
                    assert!(!tokens.contains(&END_OF_TURN));
                }
            }
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_workloads() {
        let (a, b) = (Workloads::generate(3), Workloads::generate(3));
        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
        assert_ne!(a.single.prompt, Workloads::generate(4).single.prompt);
    }
}
