//! RoPE's frequencies: how fast each pair of a head turns as the position grows.
//!
//! Pair `i` of a head of `d` values turns by `θ^(-2i/d)` radians per position
//! (θ = `rope_theta` = 500,000 for Llama 3). Llama 3 then rescales the slow pairs so the
//! model can attend over long contexts: pairs whose wavelength is longer than
//! `original_max_position_embeddings / low_freq_factor` turn `factor` times slower, pairs
//! shorter than `original / high_freq_factor` are kept, and the band in between blends
//! smoothly from one to the other.

use std::f64::consts::PI;

use crate::config::{Config, RopeScaling};

// ANCHOR: inverse_frequencies
/// The rotation speed of each of the `head_dim / 2` pairs, in radians per position.
pub fn inverse_frequencies(config: &Config) -> Vec<f32> {
    let theta = config.rope_theta.unwrap_or(10_000.0);
    let d = config.head_dim as f64;
    (0..config.head_dim / 2)
        .map(|i| {
            let base = theta.powf(-2.0 * i as f64 / d);
            let scaled = match &config.rope_scaling {
                Some(scaling) => llama3_scaled(base, scaling),
                None => base,
            };
            scaled as f32
        })
        .collect()
}

/// Llama 3's rescaling of one frequency, by its wavelength (positions per full turn).
pub fn llama3_scaled(inv_freq: f64, scaling: &RopeScaling) -> f64 {
    let wavelength = 2.0 * PI / inv_freq;
    let original = scaling.original_max_position_embeddings as f64;
    let (short, long) = (original / scaling.high_freq_factor, original / scaling.low_freq_factor);
    if wavelength < short {
        inv_freq
    } else if wavelength > long {
        inv_freq / scaling.factor
    } else {
        // 0 at the long edge of the band, 1 at the short edge.
        let smooth =
            (original / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
        (1.0 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    }
}
// ANCHOR_END: inverse_frequencies

/// Prints every pair's frequency before and after scaling, its wavelength, and its band.
pub fn print_frequency_table(config: &Config) {
    let theta = config.rope_theta.unwrap_or(10_000.0);
    let scaled = inverse_frequencies(config);
    println!();
    println!("{:>4} {:>12} {:>12} {:>14}  band", "pair", "base rad/pos", "scaled", "wavelength");
    for (i, after) in scaled.iter().enumerate() {
        let base = theta.powf(-2.0 * i as f64 / config.head_dim as f64);
        let band = match &config.rope_scaling {
            None => "no scaling",
            Some(_) if (*after as f64 - base).abs() <= base * 1e-6 => "high: kept",
            Some(s) if (*after as f64 * s.factor - base).abs() <= base * 1e-6 => "low: divided by factor",
            Some(_) => "medium: blended",
        };
        println!("{i:>4} {base:>12.4e} {after:>12.4e} {:>14.1}  {band}", 2.0 * PI / *after as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llama_reference::config::{LLAMA_3_2_1B_CONFIG_JSON, LlamaConfig};

    fn llama_3_2_config() -> Config {
        serde_json::from_str(LLAMA_3_2_1B_CONFIG_JSON).unwrap()
    }

    #[test]
    fn frequencies_match_the_reference_implementation() {
        let config = llama_3_2_config();
        let ours = inverse_frequencies(&config);
        let reference_config = LlamaConfig::from_json(LLAMA_3_2_1B_CONFIG_JSON).unwrap();
        let reference = llama_reference::rope::inverse_frequencies(&reference_config.rope, 64);
        assert_eq!(ours.len(), 32);
        for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
            assert!((*a as f64 - b).abs() <= b * 1e-6, "pair {i}: {a} vs {b}");
        }
    }

    #[test]
    fn fast_pairs_are_kept_and_slow_pairs_divided_by_the_factor() {
        let config = llama_3_2_config();
        let scaled = inverse_frequencies(&config);
        assert_eq!(scaled[0], 1.0, "pair 0 turns one radian per position");
        let base_31 = 500_000f64.powf(-62.0 / 64.0);
        assert!((scaled[31] as f64 * 32.0 - base_31).abs() < base_31 * 1e-6, "the slowest pair is divided by 32");
    }
}
