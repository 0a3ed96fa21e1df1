//! Reading tensors from `model.safetensors` (or the shards an index file names) as f32.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};

use crate::tensor::Matrix;

/// The memory-mapped safetensors files of one model directory.
pub struct Checkpoint {
    files: Vec<(PathBuf, Mmap)>,
    /// Tensor name → index into `files`.
    location: HashMap<String, usize>,
}

impl Checkpoint {
    /// Opens `model.safetensors`, or the shards listed in `model.safetensors.index.json`.
    pub fn open(model_dir: &Path) -> Result<Self> {
        let single = model_dir.join("model.safetensors");
        let index = model_dir.join("model.safetensors.index.json");
        let paths = if single.exists() {
            vec![single]
        } else if index.exists() {
            shard_paths(&index)?
        } else {
            bail!("{} has neither model.safetensors nor model.safetensors.index.json", model_dir.display());
        };
        let mut files = Vec::new();
        let mut location = HashMap::new();
        for path in paths {
            let file = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
            // SAFETY: the mapping is read-only and the file is not modified while we hold it.
            let mmap = unsafe { Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))?;
            let tensors = SafeTensors::deserialize(&mmap)
                .map_err(|e| anyhow::anyhow!("{} is not a valid safetensors file: {e}", path.display()))?;
            for name in tensors.names() {
                location.insert(name.to_string(), files.len());
            }
            files.push((path, mmap));
        }
        Ok(Checkpoint { files, location })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.location.contains_key(name)
    }

    /// Reads one tensor, converting BF16/F16/F32 to f32, and checks its shape.
    pub fn tensor_f32(&self, name: &str, expected_shape: &[usize]) -> Result<Vec<f32>> {
        let &file_index = self.location.get(name).with_context(|| format!("tensor {name} is missing"))?;
        let (path, mmap) = &self.files[file_index];
        let tensors = SafeTensors::deserialize(mmap)
            .map_err(|e| anyhow::anyhow!("{} is not a valid safetensors file: {e}", path.display()))?;
        let view = tensors.tensor(name).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        ensure!(
            view.shape() == expected_shape,
            "tensor {name} has shape {:?}, expected {:?}",
            view.shape(),
            expected_shape
        );
        let bytes = view.data();
        Ok(match view.dtype() {
            Dtype::BF16 => convert::<2>(bytes, |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            Dtype::F16 => convert::<2>(bytes, |b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            Dtype::F32 => convert::<4>(bytes, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            other => bail!("tensor {name} has dtype {other:?}; expected BF16, F16 or F32"),
        })
    }

    /// Reads a 2-D tensor as a [`Matrix`].
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        Ok(Matrix::from_vec(rows, cols, self.tensor_f32(name, &[rows, cols])?))
    }
}

/// Converts little-endian values of `N` bytes each, in parallel.
fn convert<const N: usize>(bytes: &[u8], to_f32: impl Fn(&[u8]) -> f32 + Sync + Send) -> Vec<f32> {
    bytes.par_chunks_exact(N).map(to_f32).collect()
}

fn shard_paths(index: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index).with_context(|| format!("cannot read {}", index.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", index.display()))?;
    let weight_map =
        json["weight_map"].as_object().with_context(|| format!("{} has no weight_map", index.display()))?;
    let mut names: Vec<&str> = weight_map.values().filter_map(|v| v.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let dir = index.parent().unwrap_or(Path::new("."));
    Ok(names.into_iter().map(|name| dir.join(name)).collect())
}
