//! Rotary position embeddings with Llama 3's frequency scaling, in Hugging Face's
//! "half-split" layout: within a head, element `i` is paired with element `i + head_dim/2`.

use std::f64::consts::PI;

use crate::config::{Llama3Scaling, RopeConfig};
use crate::tensor::Matrix;

/// Which of Llama 3's three bands a rotary frequency falls into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrequencyBand {
    /// Wavelength shorter than `original_max / high_freq_factor`: kept as is.
    High,
    /// In between: blended from kept to divided.
    Medium,
    /// Wavelength longer than `original_max / low_freq_factor`: divided by `factor`.
    Low,
}

/// The rotary frequency of each of the `head_dim / 2` pairs, in radians per position.
pub fn inverse_frequencies(rope: &RopeConfig, head_dim: usize) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|pair| {
            let base = rope.theta.powf(-((2 * pair) as f64) / head_dim as f64);
            match &rope.llama3_scaling {
                None => base,
                Some(scaling) => llama3_scaled(base, scaling),
            }
        })
        .collect()
}

/// The band a base (unscaled) frequency belongs to.
pub fn frequency_band(inv_freq: f64, scaling: &Llama3Scaling) -> FrequencyBand {
    let wavelength = 2.0 * PI / inv_freq;
    let original = scaling.original_max_position_embeddings as f64;
    if wavelength < original / scaling.high_freq_factor {
        FrequencyBand::High
    } else if wavelength > original / scaling.low_freq_factor {
        FrequencyBand::Low
    } else {
        FrequencyBand::Medium
    }
}

fn llama3_scaled(inv_freq: f64, scaling: &Llama3Scaling) -> f64 {
    match frequency_band(inv_freq, scaling) {
        FrequencyBand::High => inv_freq,
        FrequencyBand::Low => inv_freq / scaling.factor,
        FrequencyBand::Medium => {
            // 0 at the low edge of the band, 1 at the high edge.
            let wavelength = 2.0 * PI / inv_freq;
            let original = scaling.original_max_position_embeddings as f64;
            let smooth = (original / wavelength - scaling.low_freq_factor)
                / (scaling.high_freq_factor - scaling.low_freq_factor);
            (1.0 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
        }
    }
}

/// Rotates every head of every row in place. Row `r` holds the token at `positions[r]`;
/// its width is a whole number of heads of `head_dim`.
pub fn apply_rope(x: &mut Matrix, positions: &[usize], inv_freq: &[f64], head_dim: usize) {
    assert_eq!(x.rows, positions.len());
    assert_eq!(inv_freq.len(), head_dim / 2);
    let half = head_dim / 2;
    for (row, &position) in positions.iter().enumerate() {
        for head in x.row_mut(row).chunks_exact_mut(head_dim) {
            for (pair, &freq) in inv_freq.iter().enumerate() {
                let angle = position as f64 * freq;
                let (sin, cos) = (angle.sin() as f32, angle.cos() as f32);
                let (a, b) = (head[pair], head[pair + half]);
                head[pair] = a * cos - b * sin;
                head[pair + half] = b * cos + a * sin;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LLAMA_3_2_1B_CONFIG_JSON, LlamaConfig};

    #[test]
    fn llama3_scaling_divides_slow_frequencies_and_keeps_fast_ones() {
        let config = LlamaConfig::from_json(LLAMA_3_2_1B_CONFIG_JSON).unwrap();
        let plain = RopeConfig { theta: config.rope.theta, llama3_scaling: None };
        let scaled = inverse_frequencies(&config.rope, 64);
        let unscaled = inverse_frequencies(&plain, 64);
        let scaling = config.rope.llama3_scaling.unwrap();
        for (s, u) in scaled.iter().zip(&unscaled) {
            match frequency_band(*u, &scaling) {
                FrequencyBand::High => assert_eq!(s, u),
                FrequencyBand::Low => assert!((s * 32.0 - u).abs() < 1e-15),
                FrequencyBand::Medium => assert!(s < u && *s > u / 32.0),
            }
        }
        assert_eq!(scaled[0], 1.0);
    }

    #[test]
    fn rotation_pairs_i_with_i_plus_half_and_keeps_norms() {
        let inv_freq = vec![1.0, 0.5];
        let mut x = Matrix::from_vec(2, 4, vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
        apply_rope(&mut x, &[0, 1], &inv_freq, 4);
        assert_eq!(x.row(0), &[1.0, 2.0, 3.0, 4.0], "position 0 is not rotated");
        // Pair (0, 2) turns by 1 radian, pair (1, 3) by 0.5.
        let (s1, c1) = (1f32.sin(), 1f32.cos());
        assert!((x.row(1)[0] - (c1 - 3.0 * s1)).abs() < 1e-6);
        assert!((x.row(1)[2] - (3.0 * c1 + s1)).abs() < 1e-6);
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((norm(x.row(1)) - 30.0).abs() < 1e-4);
    }
}
