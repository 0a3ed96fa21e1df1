//! `model.safetensors`: an 8-byte length, a JSON header, then every tensor's raw bytes.
//!
//! ```text
//! [ u64 little-endian N ][ N bytes of JSON header ][ tensor bytes ........................ ]
//!                         {"model.norm.weight": {"dtype": "BF16", "shape": [2048],
//!                          "data_offsets": [0, 4096]}, ...}   offsets count from here ^
//! ```
//!
//! We map the file into memory instead of reading it: the operating system pages bytes
//! in as the GPU copy touches them, and no second copy of 2.5 GB lives in our process.

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::config::Config;

/// One tensor as the header describes it.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub name: String,
    pub shape: Vec<usize>,
    /// Where its bytes are, counted from the start of the file.
    pub bytes: Range<usize>,
}

/// A memory-mapped, validated `model.safetensors`.
pub struct Checkpoint {
    mmap: Mmap,
    pub header_len: usize,
    /// The tensors this engine uses, in the order of [`expected_tensors`].
    pub tensors: Vec<TensorEntry>,
    /// Names in the file that a Llama model does not use.
    pub ignored: Vec<String>,
}

// ANCHOR: expected_tensors
/// Every tensor a Llama model needs, with the shape its config implies, in PyTorch's
/// `[out_features, in_features]` layout for linear layers.
pub fn expected_tensors(config: &Config) -> Vec<(String, Vec<usize>)> {
    let (hidden, ffn, vocab) = (config.hidden_size, config.intermediate_size, config.vocab_size);
    let q_dim = config.num_attention_heads * config.head_dim;
    let kv_dim = config.num_key_value_heads * config.head_dim;
    let mut tensors = vec![("model.embed_tokens.weight".to_string(), vec![vocab, hidden])];
    for layer in 0..config.num_hidden_layers {
        let name = |suffix: &str| format!("model.layers.{layer}.{suffix}.weight");
        tensors.extend([
            (name("input_layernorm"), vec![hidden]),
            (name("self_attn.q_proj"), vec![q_dim, hidden]),
            (name("self_attn.k_proj"), vec![kv_dim, hidden]),
            (name("self_attn.v_proj"), vec![kv_dim, hidden]),
            (name("self_attn.o_proj"), vec![hidden, q_dim]),
            (name("post_attention_layernorm"), vec![hidden]),
            (name("mlp.gate_proj"), vec![ffn, hidden]),
            (name("mlp.up_proj"), vec![ffn, hidden]),
            (name("mlp.down_proj"), vec![hidden, ffn]),
        ]);
    }
    tensors.push(("model.norm.weight".to_string(), vec![hidden]));
    if !config.tie_word_embeddings {
        // Untied models have their own output matrix; Llama 3.2 1B reuses the embedding.
        tensors.push(("lm_head.weight".to_string(), vec![vocab, hidden]));
    }
    tensors
}
// ANCHOR_END: expected_tensors

impl Checkpoint {
    // ANCHOR: open
    /// Maps the file, lets the safetensors crate validate its structure, then checks that
    /// every tensor the config calls for is there with dtype BF16 and the right shape.
    pub fn open(path: &Path, config: &Config) -> Result<Self> {
        let mmap = map_file(path)?;
        let header_len = raw_header(&mmap).with_context(|| format!("{} is corrupt", path.display()))?.len();
        // The crate checks the JSON, every offset, and that the tensors exactly fill the file.
        let (_, metadata) = SafeTensors::read_metadata(&mmap)
            .map_err(|e| anyhow::anyhow!("{} is truncated or corrupt: {e}", path.display()))?;
        let data_start = 8 + header_len;

        let mut tensors = Vec::new();
        for (name, shape) in expected_tensors(config) {
            let info = metadata.info(&name).with_context(|| format!("{}: tensor {name} is missing", path.display()))?;
            ensure!(
                info.dtype == Dtype::BF16,
                "{}: tensor {name} has dtype {:?}, expected BF16",
                path.display(),
                info.dtype
            );
            ensure!(
                info.shape == shape,
                "{}: tensor {name} has shape {:?}, expected {shape:?} from config.json",
                path.display(),
                info.shape
            );
            // Offsets in the header count from the end of the header.
            let (start, end) = info.data_offsets;
            tensors.push(TensorEntry { name, shape, bytes: data_start + start..data_start + end });
        }
        let mut ignored: Vec<String> =
            metadata.tensors().into_keys().filter(|name| !tensors.iter().any(|t| &t.name == name)).collect();
        ignored.sort();
        Ok(Checkpoint { mmap, header_len, tensors, ignored })
    }
    // ANCHOR_END: open

    /// The bytes of one tensor, straight from the mapping.
    pub fn bytes(&self, entry: &TensorEntry) -> &[u8] {
        &self.mmap[entry.bytes.clone()]
    }

    pub fn file_len(&self) -> usize {
        self.mmap.len()
    }
}

/// Maps a file into our address space, read-only.
pub fn map_file(path: &Path) -> Result<Mmap> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: we only read the mapping, and nobody should rewrite model files under us.
    unsafe { Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))
}

// ANCHOR: raw_header
/// Reads the header by hand: 8 bytes of little-endian length, then that many bytes of JSON.
pub fn raw_header(file: &[u8]) -> Result<&str> {
    ensure!(file.len() >= 8, "file is {} bytes long, too short for the 8-byte header length", file.len());
    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap());
    let end = 8u64.checked_add(header_len).filter(|&end| end <= file.len() as u64);
    let Some(end) = end else {
        bail!("header claims {header_len} bytes but the file has only {} (truncated?)", file.len());
    };
    std::str::from_utf8(&file[8..end as usize]).context("the header is not UTF-8 text")
}
// ANCHOR_END: raw_header
