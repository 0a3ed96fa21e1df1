//! A row-major f32 matrix and the few operations the reference needs on it.

use rayon::prelude::*;

/// A row-major matrix: `rows` rows of `cols` f32 values each.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Matrix {
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Matrix { rows, cols, data: vec![0.0; rows * cols] }
    }

    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix data does not fit {rows}x{cols}");
        Matrix { rows, cols, data }
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    pub fn row_mut(&mut self, i: usize) -> &mut [f32] {
        &mut self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// A new matrix holding rows `start..end`.
    pub fn rows_slice(&self, start: usize, end: usize) -> Matrix {
        Matrix::from_vec(end - start, self.cols, self.data[start * self.cols..end * self.cols].to_vec())
    }

    /// Element-wise `self + other` (the residual connection).
    pub fn add(&self, other: &Matrix) -> Matrix {
        assert_eq!((self.rows, self.cols), (other.rows, other.cols));
        let data = self.data.iter().zip(&other.data).map(|(a, b)| a + b).collect();
        Matrix::from_vec(self.rows, self.cols, data)
    }
}

/// Dot product with eight independent partial sums, so the compiler can use SIMD
/// (a single running sum forces one addition after another).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let (a_chunks, a_rest) = a.as_chunks::<8>();
    let (b_chunks, b_rest) = b.as_chunks::<8>();
    let mut partial = [0.0f32; 8];
    for (x, y) in a_chunks.iter().zip(b_chunks) {
        for lane in 0..8 {
            partial[lane] += x[lane] * y[lane];
        }
    }
    let tail: f32 = a_rest.iter().zip(b_rest).map(|(x, y)| x * y).sum();
    partial.iter().sum::<f32>() + tail
}

/// `x · wᵀ`: a linear layer in PyTorch's convention, where `w` is stored as
/// `[out_features, in_features]`. `x` is `[n, in_features]`; the result `[n, out_features]`.
pub fn linear(x: &Matrix, w: &Matrix) -> Matrix {
    assert_eq!(x.cols, w.cols, "linear: input width {} but weight expects {}", x.cols, w.cols);
    // One task per output feature: its weight row stays in cache while every input row reads it.
    let mut by_feature = vec![0.0f32; w.rows * x.rows];
    by_feature.par_chunks_mut(x.rows).enumerate().for_each(|(feature, out)| {
        let weights = w.row(feature);
        for (token, value) in out.iter_mut().enumerate() {
            *value = dot(x.row(token), weights);
        }
    });
    let mut result = Matrix::zeros(x.rows, w.rows);
    for (feature, column) in by_feature.chunks(x.rows).enumerate() {
        for (token, value) in column.iter().enumerate() {
            result.data[token * w.rows + feature] = *value;
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_a_plain_sum_for_every_tail_length() {
        for len in 0..20 {
            let a: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 - 3.0).collect();
            let b: Vec<f32> = (0..len).map(|i| 1.0 - i as f32 * 0.25).collect();
            let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - plain).abs() < 1e-4, "len {len}");
        }
    }

    #[test]
    fn linear_uses_pytorch_weight_layout() {
        // x: 2 tokens of width 3; w: 2 output features of width 3.
        let x = Matrix::from_vec(2, 3, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let w = Matrix::from_vec(2, 3, vec![1.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
        let y = linear(&x, &w);
        assert_eq!((y.rows, y.cols), (2, 2));
        assert_eq!(y.data, vec![1.0, 5.0, 4.0, 11.0]);
    }
}
