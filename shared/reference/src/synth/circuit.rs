//! The planted circuit of a synthetic checkpoint: what the weights are built to compute,
//! and the rule that predicts its greedy output token by token.
//!
//! # The rule
//!
//! Every token on an *orbit* (a closed walk through the vocabulary) has a *successor*.
//! At each position the model looks at the current token and at the tokens a fixed
//! number of positions back ([`ECHO_HEADS`]: 5, 6 and 40 where a key/value group has four
//! query heads, as in Llama 3.2 1B and Llama 3.1 8B; 6 and 40 where it has three, as in
//! Llama 3.2 3B: [`group_heads`]). Tokens are *loud* or *quiet* ([`Circuit::is_loud`]).
//! The next token is the successor of the farthest loud token among those looked at; if
//! none of them is loud, the successor of the current token. So the output echoes the
//! prompt's loud words, each moved one step along its orbit, and a prompt whose last words
//! are quiet runs down a fixed quiet path from `"\n\n"` to `<|eot_id|>` ([`END_AFTER`]
//! steps) and stops.
//!
//! # How the weights compute it
//!
//! All of it happens in layer 0's attention; the other layers are random.
//!
//! - Every embedding row is split into parts ([`Layout`]): a constant *anchor*
//!   coordinate, a *loudness* coordinate (+3 loud, -3 quiet), a *sink* coordinate set
//!   only in `<|begin_of_text|>`'s row, the *echo* coordinates (as many as the key/value
//!   width) and random filler. On the echo coordinates, the successor's row is the
//!   token's row moved one coordinate along: `echo(successor)[c + 1] = echo(token)[c]`.
//!   Every row has the same norm, so RMSNorm scales them all alike.
//! - Each query head looks a fixed distance back through RoPE. Its query and key are
//!   constant vectors made from the anchor; RoPE turns them by their positions, so their
//!   dot product depends only on the distance between the two positions, and the phases
//!   are chosen to peak, with a wide margin, at the head's distance ([`position_profile`]).
//! - The slowest rotary pair carries content instead of position: loud keys score extra,
//!   and `<|begin_of_text|>`'s key (no anchor, only the sink) scores just above a quiet
//!   target. A head whose target is quiet, or missing because the sequence is too short,
//!   therefore attends to `<|begin_of_text|>`, whose value is zero: it adds nothing.
//! - Values copy the echo coordinates; `o_proj` writes each one a coordinate further on,
//!   so a head that attends to token `t` adds the echo part of `successor(t)` to the
//!   residual stream, scaled by the head's gain. Farther heads have larger gains, and
//!   the tied LM head turns the largest contribution into the largest logit.
//! - The head at distance 0 has no content term: it always copies the current token's
//!   successor, the default when no other head speaks.
//!
//! Margins: attention scores of the chosen key lead every other key by at least
//! [`SCORE_MARGIN`] (so each head attends to one key), and each gain outweighs all smaller
//! ones together by half again, so the winning logit leads the runner-up by a fifth of
//! itself or more (`tests/synth.rs` requires it): bf16 rounding cannot change it.

use crate::config::LlamaConfig;
use crate::rope::inverse_frequencies;

/// Ids below this are ordinary text tokens; from it on, Llama 3's 256 special tokens.
pub const SPECIAL_TOKENS_START: u32 = 128_000;
/// `<|begin_of_text|>`: the attention sink.
pub const BEGIN_OF_TEXT: u32 = 128_000;
/// `<|eot_id|>`: the end of a turn, where the quiet path ends.
pub const END_OF_TURN: u32 = 128_009;
/// `"\n\n"`, the last token of every chat prompt (it closes the assistant header).
pub const DOUBLE_NEWLINE: u32 = 271;
/// The chat format's role words `system`, `user` and `assistant`: quiet, so that the
/// headers every chat prompt shares are never echoed.
pub const ROLE_TOKENS: [u32; 3] = [9125, 882, 78191];
/// Tokens below this id are quiet. BPE numbers merges from the most frequent, so these
/// are punctuation, spaces and short common words (`"."` is 13, `" the"` 279).
pub const QUIET_BELOW: u32 = 1000;
/// How many steps after `"\n\n"` the quiet path reaches `<|eot_id|>`.
pub const END_AFTER: usize = 20;

/// Distances the heads of a key/value group of four look back, in the order of a group's
/// query heads, with the gain of what they copy. Distance 0 is the current token and is
/// never gated; the others speak only for a loud token. The farther, the louder: each gain
/// is 1.5 times all smaller gains together plus the token's own row (worth 4/3 of a gain,
/// since the echo holds 3/4 of a row's energy), so the rule holds by a third even when
/// several heads and the current token all point at the same token. Smaller groups drop
/// the nearest looking-back heads ([`group_heads`]).
pub const ECHO_HEADS: [EchoHead; 4] = [
    EchoHead { distance: 0, gain: 2.0 },
    EchoHead { distance: 5, gain: 5.0 },
    EchoHead { distance: 6, gain: 12.5 },
    EchoHead { distance: 40, gain: 31.25 },
];

/// One query head of layer 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EchoHead {
    /// How many positions back it reads.
    pub distance: usize,
    /// How strongly what it copies is written into the residual stream.
    pub gain: f32,
}

impl EchoHead {
    /// Whether the head only speaks for loud tokens.
    pub fn is_gated(&self) -> bool {
        self.distance > 0
    }
}

/// By how much (in softmax units) the key a head should read beats every other key.
pub const SCORE_MARGIN: f64 = 12.0;
/// Positions over which the attention margins are guaranteed (twice our engine's context).
pub const PLANTED_CONTEXT: usize = 4096;

/// Where each part of an embedding row lives.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub hidden: usize,
    /// First echo coordinate; there are `echo_len` of them, one closed cycle.
    pub echo_start: usize,
    pub echo_len: usize,
}

impl Layout {
    pub const ANCHOR: usize = 0;
    pub const LOUDNESS: usize = 1;
    pub const SINK: usize = 2;

    pub fn new(config: &LlamaConfig) -> Self {
        Layout { hidden: config.hidden_size, echo_start: 3, echo_len: config.kv_dim() }
    }

    /// The echo coordinate `steps` further along the cycle than echo coordinate `index`.
    pub fn echo(&self, index: usize, steps: usize) -> usize {
        self.echo_start + (index + steps) % self.echo_len
    }

    /// First filler coordinate (random, different for every token).
    pub fn filler_start(&self) -> usize {
        self.echo_start + self.echo_len
    }
}

/// The orbits, loudness and positional profile of a synthetic model made with one seed.
pub struct Circuit {
    pub layout: Layout,
    /// Tokens in orbit order: orbit `o` is `orbit_order[o * len .. (o + 1) * len]`.
    orbit_order: Vec<u32>,
    /// Index into `orbit_order` of every token, `None` off the orbits.
    place_of_token: Vec<Option<u32>>,
    /// The heads of one key/value group (query heads `g * group .. (g + 1) * group`).
    pub heads: Vec<EchoHead>,
}

impl Circuit {
    pub fn new(config: &LlamaConfig, seed: u64) -> anyhow::Result<Self> {
        let layout = Layout::new(config);
        let regular = SPECIAL_TOKENS_START as usize;
        anyhow::ensure!(
            config.vocab_size > END_OF_TURN as usize,
            "a synthetic model needs Llama 3's vocabulary (special tokens up to {END_OF_TURN})"
        );
        anyhow::ensure!(
            regular.is_multiple_of(layout.echo_len) && layout.echo_len > END_AFTER,
            "the key/value width {} must divide {regular} and exceed {END_AFTER}",
            layout.echo_len
        );
        anyhow::ensure!(layout.filler_start() < layout.hidden, "the hidden size leaves no room for filler");
        let group = config.group_size();
        anyhow::ensure!(
            group >= 2,
            "a synthetic model needs at least 2 query heads per KV head (one to look back), not {group}"
        );
        let orbit_order = orbit_order(seed);
        let mut place_of_token = vec![None; config.vocab_size];
        for (place, &token) in orbit_order.iter().enumerate() {
            place_of_token[token as usize] = Some(place as u32);
        }
        Ok(Circuit { layout, orbit_order, place_of_token, heads: group_heads(group) })
    }

    /// Length of every orbit: one full turn of the echo coordinates.
    pub fn orbit_length(&self) -> usize {
        self.layout.echo_len
    }

    /// `(orbit, step)` of a token on an orbit.
    pub fn place(&self, token: u32) -> Option<(usize, usize)> {
        let place = (*self.place_of_token.get(token as usize)?)? as usize;
        Some((place / self.orbit_length(), place % self.orbit_length()))
    }

    /// The token one step further along `token`'s orbit; `None` for tokens off the orbits
    /// (special tokens other than `<|eot_id|>`, and one ordinary token that made room for it).
    pub fn successor(&self, token: u32) -> Option<u32> {
        let (orbit, step) = self.place(token)?;
        Some(self.orbit_order[orbit * self.orbit_length() + (step + 1) % self.orbit_length()])
    }

    /// Loud tokens are echoed by the heads that look back. Quiet: the special tokens, the
    /// chat format's role words, ids below [`QUIET_BELOW`] and tokens off the orbits.
    pub fn is_loud(&self, token: u32) -> bool {
        (QUIET_BELOW..SPECIAL_TOKENS_START).contains(&token)
            && !ROLE_TOKENS.contains(&token)
            && self.place(token).is_some()
    }

    // ANCHOR: next_token
    /// What greedy decoding produces after `ids`, by the rule. `None` when the rule picks a
    /// token off the orbits (the model's choice is then not planted).
    pub fn next_token(&self, ids: &[u32]) -> Option<u32> {
        let current = ids.len().checked_sub(1)?;
        let speaking = self.heads.iter().filter(|head| head.distance <= current).filter_map(|head| {
            let token = ids[current - head.distance];
            (!head.is_gated() || self.is_loud(token)).then_some((head.gain, token))
        });
        let (_, token) = speaking.max_by(|a, b| a.0.total_cmp(&b.0))?;
        self.successor(token)
    }
    // ANCHOR_END: next_token

    /// Greedy decoding by the rule: up to `max_new_tokens`, stopping after any of `stop_ids`
    /// (included), or early where the rule says nothing.
    pub fn greedy(&self, prompt: &[u32], max_new_tokens: usize, stop_ids: &[u32]) -> Vec<u32> {
        let mut ids = prompt.to_vec();
        let mut generated = Vec::new();
        while generated.len() < max_new_tokens {
            let Some(next) = self.next_token(&ids) else { break };
            generated.push(next);
            ids.push(next);
            if stop_ids.contains(&next) {
                break;
            }
        }
        generated
    }
}

/// The heads of a key/value group of `group` (at least 2) query heads: the self head,
/// then the farthest `group - 1` of the heads that look back, so a group of 3 (Llama 3.2
/// 3B) looks 6 and 40 back and a group of 2 only 40. Dropping the smallest gains keeps
/// every remaining gain at least 1.5 times all smaller ones together plus the own row,
/// and keeps the farthest reach, which is what tells a paged KV cache's old pages apart.
/// Query heads beyond four (none in the Llama shapes we make) repeat the self head.
pub fn group_heads(group: usize) -> Vec<EchoHead> {
    let looking_back = &ECHO_HEADS[1..];
    let kept = (group - 1).min(looking_back.len());
    let mut heads = vec![ECHO_HEADS[0]];
    heads.extend_from_slice(&looking_back[looking_back.len() - kept..]);
    heads.resize(group, ECHO_HEADS[0]);
    heads
}

/// The orbit order: `"\n\n"`, then [`END_AFTER`]` - 1` quiet tokens, then `<|eot_id|>`
/// (the quiet path), then every other ordinary token in a seeded random order. One
/// ordinary token is left off to make room for `<|eot_id|>`.
fn orbit_order(seed: u64) -> Vec<u32> {
    let quiet_path: Vec<u32> = super::shuffled(QUIET_BELOW as usize, super::stream_key(seed, "quiet path"))
        .into_iter()
        .filter(|&t| t != DOUBLE_NEWLINE)
        .take(END_AFTER - 1)
        .collect();
    let mut order = vec![DOUBLE_NEWLINE];
    order.extend(&quiet_path);
    order.push(END_OF_TURN);
    let others = super::shuffled(SPECIAL_TOKENS_START as usize, super::stream_key(seed, "orbits"));
    order.extend(others.into_iter().filter(|t| *t != DOUBLE_NEWLINE && !quiet_path.contains(t)));
    order.truncate(SPECIAL_TOKENS_START as usize);
    order
}

/// The positional part of every head's query-key product: how much each rotary pair
/// contributes (summing to 1, largest first). Half goes to the fastest pair, which tells
/// neighbours apart; the other half is spread evenly over the pairs whose wavelength is
/// under 1,000 positions, which tell far positions apart (12 pairs with head size 64, 24
/// with 128). With Llama 3's RoPE and head size 64 or 128 the peak beats every other
/// distance up to [`PLANTED_CONTEXT`] by a quarter of its height ([`position_gap`]).
pub fn position_profile(inv_freq: &[f64]) -> Vec<f64> {
    let slow = inv_freq.iter().skip(1).filter(|&&f| 2.0 * std::f64::consts::PI / f < 1000.0).count();
    (0..inv_freq.len())
        .map(|pair| match pair {
            0 => 0.5,
            p if p <= slow => 0.5 / slow as f64,
            _ => 0.0,
        })
        .collect()
}

/// How far the profile's peak (distance 0 from the target) stands above its value at
/// every other distance within [`PLANTED_CONTEXT`], as a fraction of the peak height.
pub fn position_gap(profile: &[f64], inv_freq: &[f64]) -> f64 {
    let reach = PLANTED_CONTEXT as i64;
    (-reach..=reach)
        .filter(|&delta| delta != 0)
        .map(|delta| profile.iter().zip(inv_freq).map(|(a, f)| a * (1.0 - (f * delta as f64).cos())).sum::<f64>())
        .fold(f64::INFINITY, f64::min)
}

/// The rotary frequencies of a config, for the circuit's positional heads.
pub fn rotary_frequencies(config: &LlamaConfig) -> Vec<f64> {
    inverse_frequencies(&config.rope, config.head_dim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaller_groups_keep_the_self_head_and_the_farthest_heads() {
        let distances = |group| group_heads(group).iter().map(|h| h.distance).collect::<Vec<_>>();
        assert_eq!(distances(2), [0, 40]);
        assert_eq!(distances(3), [0, 6, 40]);
        assert_eq!(distances(4), [0, 5, 6, 40]);
        assert_eq!(distances(6), [0, 5, 6, 40, 0, 0]);
        // Each gated gain is at least 1.5 times all smaller gains together plus the own row.
        for group in 2..=4 {
            let heads = group_heads(group);
            for (i, head) in heads.iter().enumerate().skip(1) {
                let smaller: f32 = heads[..i].iter().map(|h| h.gain).sum::<f32>() + 4.0 / 3.0;
                assert!(head.gain >= 1.5 * smaller - 1e-4, "group {group}, head {head:?}");
            }
        }
    }
}
