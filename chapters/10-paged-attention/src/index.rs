//! `model.safetensors.index.json`: how a checkpoint split into shards says which file holds
//! each tensor. Llama 3.2 3B comes in two shards, Llama 3.1 8B in four:
//!
//! ```text
//! {"metadata": {"total_size": 6425499648},
//!  "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
//!                 "model.norm.weight":         "model-00002-of-00002.safetensors", ...}}
//! ```
//!
//! Each shard is an ordinary safetensors file; the index only maps names to files.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde::Deserialize;

/// The index's name, next to its shards.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

// ANCHOR: shard_index
/// What the index says: the shard files, and which one holds each tensor.
#[derive(Debug)]
pub struct ShardIndex {
    /// The shard file names (not paths), in name order, each once.
    pub shards: Vec<String>,
    /// Tensor name → index into `shards`.
    pub shard_of: HashMap<String, usize>,
}

#[derive(Deserialize)]
struct RawIndex {
    weight_map: BTreeMap<String, String>,
}

impl ShardIndex {
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("{} is not a usable shard index", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self> {
        let raw: RawIndex = serde_json::from_str(text).context("expected {\"weight_map\": {tensor: file, ...}}")?;
        ensure!(!raw.weight_map.is_empty(), "its weight_map lists no tensors");
        let mut shards: Vec<String> = raw.weight_map.values().cloned().collect();
        shards.sort();
        shards.dedup();
        for shard in &shards {
            // A name like "../x" or "/etc/passwd" would read a file outside the model folder.
            let plain = Path::new(shard).file_name().is_some_and(|name| name == shard.as_str());
            ensure!(plain && !shard.starts_with('.'), "shard {shard:?} is not a file name in the model folder");
        }
        let position: HashMap<&str, usize> = shards.iter().enumerate().map(|(i, shard)| (shard.as_str(), i)).collect();
        let shard_of =
            raw.weight_map.iter().map(|(tensor, shard)| (tensor.clone(), position[shard.as_str()])).collect();
        Ok(ShardIndex { shards, shard_of })
    }
}
// ANCHOR_END: shard_index

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_shards_and_where_each_tensor_is() {
        let index = ShardIndex::parse(
            r#"{"metadata": {"total_size": 12},
                "weight_map": {"b": "model-00002-of-00002.safetensors", "a": "model-00001-of-00002.safetensors",
                               "c": "model-00001-of-00002.safetensors"}}"#,
        )
        .unwrap();
        assert_eq!(index.shards, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);
        assert_eq!((index.shard_of["a"], index.shard_of["b"], index.shard_of["c"]), (0, 1, 0));
    }

    #[test]
    fn refuses_shard_names_that_leave_the_model_folder() {
        for name in ["../model.safetensors", "/etc/passwd", "sub/model.safetensors", ".hidden", ""] {
            let text = format!(r#"{{"weight_map": {{"a": {name:?}}}}}"#);
            let err = ShardIndex::parse(&text).unwrap_err().to_string();
            assert!(err.contains("is not a file name in the model folder"), "{name}: {err}");
        }
    }

    #[test]
    fn refuses_an_index_without_tensors_or_weight_map() {
        assert!(ShardIndex::parse(r#"{"weight_map": {}}"#).unwrap_err().to_string().contains("lists no tensors"));
        assert!(ShardIndex::parse(r#"{"metadata": {}}"#).is_err());
    }
}
