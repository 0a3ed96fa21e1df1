//! Byte-pair merging of one pre-tokenized piece.
//!
//! The rule, as in tiktoken: start with one part per byte, then repeatedly
//! merge the adjacent pair whose concatenation is the token with the lowest
//! rank (leftmost pair on a tie), until no adjacent pair forms a token.
//! A token's rank is its id: here we say "rank" because that is its role.
//!
//! Done literally, every merge rescans all pairs: O(n²) for an n-byte piece,
//! which crawls on a 25,000-byte run of letters. Instead we keep
//!
//! * the parts as a doubly linked list laid over the byte offsets, so a merge
//!   is O(1), and
//! * a min-heap of candidate merges keyed by (rank, start offset), so the
//!   next merge is found in O(log n).
//!
//! A merge changes only the pairs that touch the merged part. Rather than
//! finding and deleting the outdated heap entries, we leave them in the heap
//! and skip them when they surface ("lazy invalidation"). Each merge pushes at
//! most two entries, so the whole piece costs O(n log n).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use anyhow::{Result, bail};

/// Marks a byte offset that is not the start of a part (it was merged into
/// the part on its left).
const NOT_A_PART: usize = usize::MAX;

// ANCHOR: mergeable_ranks
/// The ordinary tokens, looked up by their bytes.
pub(crate) struct MergeableRanks {
    by_bytes: HashMap<Vec<u8>, u32>,
    /// The token of each single byte: where every piece starts from.
    by_single_byte: [u32; 256],
}
// ANCHOR_END: mergeable_ranks

impl MergeableRanks {
    /// Fails if some byte value has no token of its own, because then not
    /// every text could be encoded.
    pub(crate) fn new(by_bytes: HashMap<Vec<u8>, u32>) -> Result<Self> {
        let mut by_single_byte = [0; 256];
        for (byte, rank) in (0..=u8::MAX).zip(&mut by_single_byte) {
            match by_bytes.get([byte].as_slice()) {
                Some(&found) => *rank = found,
                None => bail!("no token for the single byte {byte:#04x}"),
            }
        }
        Ok(Self { by_bytes, by_single_byte })
    }

    /// The id of the token with exactly these bytes.
    pub(crate) fn rank_of(&self, bytes: &[u8]) -> Option<u32> {
        self.by_bytes.get(bytes).copied()
    }

    // ANCHOR: encode_piece
    /// Appends the tokens of `piece` to `out`.
    pub(crate) fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        // Most pieces (common words) are tokens already.
        if let Some(rank) = self.rank_of(piece) {
            out.push(rank);
            return;
        }
        let mut parts = Parts::one_per_byte(piece, &self.by_single_byte);
        let mut candidates = BinaryHeap::new();
        for start in 0..piece.len().saturating_sub(1) {
            self.push_candidate(&mut candidates, piece, start, start + 2);
        }
        while let Some(Reverse((rank, start, end))) = candidates.pop() {
            if !parts.is_adjacent_pair(start, end) {
                continue; // outdated: one of its two parts was merged since
            }
            parts.merge(start, end, rank);
            if let Some(previous) = parts.previous_start(start) {
                self.push_candidate(&mut candidates, piece, previous, end);
            }
            if let Some(after_next) = parts.end_of_part_after(start) {
                self.push_candidate(&mut candidates, piece, start, after_next);
            }
        }
        out.extend(parts.ranks_in_order());
    }
    // ANCHOR_END: encode_piece

    // ANCHOR: push_candidate
    /// Offers merging `piece[start..end]` into one part, if it is a token.
    fn push_candidate(
        &self,
        candidates: &mut BinaryHeap<Reverse<(u32, usize, usize)>>,
        piece: &[u8],
        start: usize,
        end: usize,
    ) {
        if let Some(rank) = self.rank_of(&piece[start..end]) {
            // Reverse turns the max-heap into a min-heap; ordering by
            // (rank, start) picks the lowest rank, then the leftmost pair.
            candidates.push(Reverse((rank, start, end)));
        }
    }
    // ANCHOR_END: push_candidate
}

// ANCHOR: parts
/// The parts of a piece, as a linked list indexed by byte offset: the part
/// that starts at byte `s` covers `s..end[s]`.
struct Parts {
    end: Vec<usize>,
    /// Start of the part before the part starting at `s`; only meaningful
    /// while `s` starts a part.
    previous: Vec<Option<usize>>,
    /// Token of the part starting at `s`.
    rank: Vec<u32>,
}
// ANCHOR_END: parts

// ANCHOR: parts_impl
impl Parts {
    fn one_per_byte(piece: &[u8], by_single_byte: &[u32; 256]) -> Self {
        Self {
            end: (1..=piece.len()).collect(),
            previous: (0..piece.len()).map(|s| s.checked_sub(1)).collect(),
            rank: piece.iter().map(|&b| by_single_byte[usize::from(b)]).collect(),
        }
    }

    fn len(&self) -> usize {
        self.end.len()
    }

    /// True if `start..end` is exactly two neighbouring parts right now.
    ///
    /// Enough to validate a heap entry: parts only ever grow, so if a part
    /// still starts at `start` and the part after it still ends at `end`,
    /// the boundary between them is the one the entry was made for.
    fn is_adjacent_pair(&self, start: usize, end: usize) -> bool {
        let middle = self.end[start];
        middle != NOT_A_PART && middle < self.len() && self.end[middle] == end
    }

    fn merge(&mut self, start: usize, end: usize, rank: u32) {
        let middle = self.end[start];
        self.end[middle] = NOT_A_PART;
        self.end[start] = end;
        self.rank[start] = rank;
        if end < self.len() {
            self.previous[end] = Some(start);
        }
    }

    fn previous_start(&self, start: usize) -> Option<usize> {
        self.previous[start]
    }

    /// End of the part that follows the part starting at `start`, if any.
    fn end_of_part_after(&self, start: usize) -> Option<usize> {
        let next = self.end[start];
        (next < self.len()).then(|| self.end[next])
    }

    fn ranks_in_order(&self) -> Vec<u32> {
        let mut ranks = Vec::new();
        let mut start = 0;
        while start < self.len() {
            ranks.push(self.rank[start]);
            start = self.end[start];
        }
        ranks
    }
}
// ANCHOR_END: parts_impl

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A toy vocabulary: all single bytes, then the given merges in rank order.
    fn toy_ranks(merges: &[&str]) -> MergeableRanks {
        let mut by_bytes: HashMap<Vec<u8>, u32> = (0..=255u8).map(|b| (vec![b], u32::from(b))).collect();
        for (i, merged) in merges.iter().enumerate() {
            by_bytes.insert(merged.as_bytes().to_vec(), 256 + i as u32);
        }
        MergeableRanks::new(by_bytes).unwrap()
    }

    fn encode(ranks: &MergeableRanks, piece: &str) -> Vec<u32> {
        let mut out = Vec::new();
        ranks.encode_piece(piece.as_bytes(), &mut out);
        out
    }

    // ANCHOR: naive
    /// tiktoken's rule done the textbook O(n²) way: rescan every pair after
    /// each merge.
    fn encode_naively(ranks: &MergeableRanks, piece: &[u8]) -> Vec<u32> {
        if let Some(&rank) = ranks.by_bytes.get(piece) {
            return vec![rank];
        }
        let mut parts: Vec<Vec<u8>> = piece.iter().map(|&b| vec![b]).collect();
        loop {
            let best = (0..parts.len().saturating_sub(1))
                .filter_map(|i| {
                    let pair = [parts[i].as_slice(), parts[i + 1].as_slice()].concat();
                    ranks.by_bytes.get(&pair).map(|&rank| (rank, i))
                })
                .min();
            let Some((_, i)) = best else { break };
            let right = parts.remove(i + 1);
            parts[i].extend(right);
        }
        parts.iter().map(|part| ranks.by_bytes[part]).collect()
    }
    // ANCHOR_END: naive

    #[test]
    fn lowest_rank_pair_merges_first() {
        // "bc" outranks "ab", so "abc" becomes "a" + "bc", not "ab" + "c".
        let ranks = toy_ranks(&["bc", "ab"]);
        assert_eq!(encode(&ranks, "abc"), [u32::from(b'a'), 256]);
    }

    #[test]
    fn leftmost_pair_wins_a_tie() {
        let ranks = toy_ranks(&["aa"]);
        assert_eq!(encode(&ranks, "aaa"), [256, u32::from(b'a')]);
    }

    #[test]
    fn merged_parts_merge_again() {
        let ranks = toy_ranks(&["ab", "cd", "abcd"]);
        assert_eq!(encode(&ranks, "abcd"), [258]);
        assert_eq!(encode(&ranks, "abcdab"), [258, 256]);
    }

    #[test]
    fn a_piece_that_is_a_token_is_taken_whole() {
        // "abc" is a token even though no merge path leads to it.
        let ranks = toy_ranks(&["abc"]);
        assert_eq!(encode(&ranks, "abc"), [256]);
    }

    #[test]
    fn empty_and_single_byte_pieces() {
        let ranks = toy_ranks(&[]);
        assert_eq!(encode(&ranks, ""), Vec::<u32>::new());
        assert_eq!(encode(&ranks, "z"), [u32::from(b'z')]);
    }

    #[test]
    fn every_byte_needs_a_token() {
        let by_bytes: HashMap<Vec<u8>, u32> = (0..=254u8).map(|b| (vec![b], u32::from(b))).collect();
        let error = MergeableRanks::new(by_bytes).err().unwrap();
        assert_eq!(error.to_string(), "no token for the single byte 0xff");
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 500,
            rng_seed: proptest::test_runner::RngSeed::Fixed(2),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// The heap version makes exactly the merges of the naive loop.
        #[test]
        fn heap_merging_matches_naive_merging(piece in "[abc]{0,40}") {
            let ranks = toy_ranks(&["ab", "ba", "aa", "bc", "abab", "cc", "aab", "ccc", "abc", "cab"]);
            prop_assert_eq!(encode(&ranks, &piece), encode_naively(&ranks, piece.as_bytes()));
        }
    }
}
