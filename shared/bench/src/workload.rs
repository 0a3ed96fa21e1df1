//! The benchmark's workloads, written once to a JSON file that every measured system reads
//! (our chapters through this crate, transformers through `hf_bench.py`), so that all of
//! them run exactly the same requests.
//!
//! Prompts are token ids, not text: speed does not depend on which tokens they are, and
//! ids need no tokenizer. Every id is an ordinary token of Llama 3's vocabulary (below
//! 128,000, where the special tokens begin), and every request generates exactly its
//! budget: the systems are told to ignore end tokens, so a run's work is fixed.

use anyhow::{Context, Result};
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
    fn the_same_seed_gives_the_same_workloads() {
        let (a, b) = (Workloads::generate(3), Workloads::generate(3));
        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
        assert_ne!(a.single.prompt, Workloads::generate(4).single.prompt);
    }
}
