//! The files a checkpoint's tensors go into, as Hugging Face lays them out.
//!
//! A small model is one `model.safetensors`. A larger one is split into shards,
//! `model-00001-of-00002.safetensors` and so on, plus `model.safetensors.index.json`, whose
//! `weight_map` says which shard holds each tensor. Hugging Face fills each shard, in tensor
//! order, until the next tensor would take it past the largest shard size (5 GB by default);
//! a tensor larger than that goes alone into its own shard. With 5 GB, Llama 3.2 3B's
//! 6.43 GB come as two shards and Llama 3.1 8B's 16.06 GB as four, as in the real downloads.
//! A split that needs only one shard is written as `model.safetensors`, as Hugging Face does.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result};
use safetensors::View;

/// Hugging Face's default largest shard: 5 GB (10⁹ bytes each) of tensor data.
pub const HUGGING_FACE_SHARD_BYTES: u64 = 5_000_000_000;
/// The weights of a model that is not sharded.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded model: total size and the shard of every tensor.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// What [`write`] wrote.
pub(crate) struct Written {
    /// Number of safetensors files.
    pub(crate) files: usize,
    /// Bytes of tensor data in all of them.
    pub(crate) bytes: u64,
}

/// The shard (from 0) of each tensor, given the tensors' sizes in order: each shard takes
/// tensors until the next would take it past `limit`; a tensor larger than `limit` starts
/// a shard and, since nothing fits beside it, ends it.
pub fn assign_shards(sizes: &[u64], limit: u64) -> Vec<usize> {
    let mut shard = 0;
    let mut filled = 0;
    sizes
        .iter()
        .map(|&size| {
            if filled > 0 && filled + size > limit {
                shard += 1;
                filled = 0;
            }
            filled += size;
            shard
        })
        .collect()
}

/// The name of shard `number` (from 1) of `count`, as Hugging Face spells it.
pub fn shard_file_name(number: usize, count: usize) -> String {
    format!("model-{number:05}-of-{count:05}.safetensors")
}

/// Whether `name` is a shard's name, `model-NNNNN-of-NNNNN.safetensors`.
fn is_shard_file_name(name: &str) -> bool {
    let five_digits = |part: &str| part.len() == 5 && part.bytes().all(|b| b.is_ascii_digit());
    let Some(numbers) = name.strip_prefix("model-").and_then(|rest| rest.strip_suffix(".safetensors")) else {
        return false;
    };
    matches!(numbers.split_once("-of-"), Some((number, count)) if five_digits(number) && five_digits(count))
}

/// Removes the weight files of an earlier write from `dir`: `model.safetensors`, the index
/// and every shard. Loaders read `model.safetensors` when there is one and the index
/// otherwise, so a leftover of another layout would be read instead of (or beside) the new
/// files. Nothing else is touched.
pub(crate) fn remove_old_weights(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if (name == SINGLE_FILE || name == INDEX_FILE || is_shard_file_name(name)) && entry.path().is_file() {
            std::fs::remove_file(entry.path()).with_context(|| format!("cannot remove {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Writes `tensors` into `dir`: as shards of at most `limit` bytes with an index, or, with
/// no limit or when one shard holds them all, as `model.safetensors`. Shards are written one
/// after another, and each tensor's bytes are asked for only when its turn comes.
pub(crate) fn write<V: View>(tensors: Vec<(String, V)>, limit: Option<u64>, dir: &Path) -> Result<Written> {
    let sizes: Vec<u64> = tensors.iter().map(|(_, tensor)| tensor.data_len() as u64).collect();
    let bytes = sizes.iter().sum();
    let shard_of = match limit {
        Some(limit) => assign_shards(&sizes, limit),
        None => vec![0; sizes.len()],
    };
    let count = shard_of.last().map_or(1, |last| last + 1);
    if count == 1 {
        write_file(tensors, &dir.join(SINGLE_FILE))?;
        return Ok(Written { files: 1, bytes });
    }

    let names: Vec<String> = (1..=count).map(|number| shard_file_name(number, count)).collect();
    let weight_map: BTreeMap<&str, &str> =
        tensors.iter().zip(&shard_of).map(|((name, _), &shard)| (name.as_str(), names[shard].as_str())).collect();
    let index = serde_json::json!({ "metadata": { "total_size": bytes }, "weight_map": weight_map });
    let index_path = dir.join(INDEX_FILE);
    std::fs::write(&index_path, serde_json::to_string_pretty(&index)? + "\n")
        .with_context(|| format!("cannot write {}", index_path.display()))?;

    let mut groups: Vec<Vec<(String, V)>> = (0..count).map(|_| Vec::new()).collect();
    for (tensor, shard) in tensors.into_iter().zip(shard_of) {
        groups[shard].push(tensor);
    }
    for (group, name) in groups.into_iter().zip(&names) {
        write_file(group, &dir.join(name))?;
    }
    Ok(Written { files: count, bytes })
}

/// One safetensors file, with the `{"format": "pt"}` metadata that PyTorch checkpoints carry.
fn write_file<V: View>(tensors: Vec<(String, V)>, path: &Path) -> Result<()> {
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(tensors, Some(metadata), path)
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_fill_up_to_the_limit_and_a_large_tensor_goes_alone() {
        assert_eq!(assign_shards(&[3, 3, 3, 1], 6), [0, 0, 1, 1]);
        assert_eq!(assign_shards(&[2, 9, 2, 2], 5), [0, 1, 2, 2]);
        assert_eq!(assign_shards(&[9, 9], 5), [0, 1]);
        assert_eq!(assign_shards(&[5, 1], 5), [0, 1]);
        assert_eq!(assign_shards(&[], 5), Vec::<usize>::new());
    }

    #[test]
    fn shard_names_are_hugging_faces() {
        assert_eq!(shard_file_name(1, 4), "model-00001-of-00004.safetensors");
        assert!(is_shard_file_name("model-00002-of-00002.safetensors"));
        for other in [
            "model.safetensors",
            "model-1-of-2.safetensors",
            "model-00001-of-00002.bin",
            "xmodel-00001-of-00002.safetensors",
        ] {
            assert!(!is_shard_file_name(other), "{other}");
        }
    }

    #[test]
    fn old_weights_of_either_layout_go_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let old = ["model.safetensors", "model.safetensors.index.json", "model-00003-of-00004.safetensors"];
        let kept = ["config.json", "model-1-of-2.safetensors", "notes.txt"];
        for name in old.iter().chain(&kept) {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        remove_old_weights(dir.path()).unwrap();
        let mut left: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, kept);
    }
}
