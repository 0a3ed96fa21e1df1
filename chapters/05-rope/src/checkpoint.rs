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
use std::path::{Path, PathBuf};

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
/// The nine tensors of every decoder layer, named `model.layers.{i}.{suffix}.weight`: the
/// one list of them that the loader, the uploader and the check all follow.
pub const LAYER_TENSORS: [&str; 9] = [
    "input_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "post_attention_layernorm",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// The file's name for one of layer `layer`'s [`LAYER_TENSORS`].
pub fn layer_tensor_name(layer: usize, suffix: &str) -> String {
    format!("model.layers.{layer}.{suffix}.weight")
}

/// Every tensor a Llama model needs, with the shape its config implies, in PyTorch's
/// `[out_features, in_features]` layout for linear layers.
pub fn expected_tensors(config: &Config) -> Vec<(String, Vec<usize>)> {
    let (hidden, ffn, vocab) = (config.hidden_size, config.intermediate_size, config.vocab_size);
    let q_dim = config.num_attention_heads * config.head_dim;
    let kv_dim = config.num_key_value_heads * config.head_dim;
    let layer_shape = |suffix: &str| match suffix {
        "input_layernorm" | "post_attention_layernorm" => vec![hidden],
        "self_attn.q_proj" => vec![q_dim, hidden],
        "self_attn.k_proj" | "self_attn.v_proj" => vec![kv_dim, hidden],
        "self_attn.o_proj" => vec![hidden, q_dim],
        "mlp.gate_proj" | "mlp.up_proj" => vec![ffn, hidden],
        "mlp.down_proj" => vec![hidden, ffn],
        other => unreachable!("{other} is not in LAYER_TENSORS"),
    };
    let mut tensors = vec![("model.embed_tokens.weight".to_string(), vec![vocab, hidden])];
    for layer in 0..config.num_hidden_layers {
        tensors.extend(LAYER_TENSORS.map(|suffix| (layer_tensor_name(layer, suffix), layer_shape(suffix))));
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

// ANCHOR: default_paths
/// Where the README's download puts the weights: the chapters' default `--model`.
pub const DEFAULT_MODEL_DIR: &str = "models/llama-3.2-1b-instruct";

/// The checkout we run in: the nearest folder at or above the current one that holds both
/// `chapters/` and `models/`, or `None` outside a checkout.
pub fn repository_root() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors().find(|dir| dir.join("chapters").is_dir() && dir.join("models").is_dir()).map(Path::to_path_buf)
}

/// A default such as `models/tokenizer.model`, found from the repository root, so that
/// `cargo run -p …` reads the same files from the root and from a chapter's folder (outside
/// a checkout, from the current folder). A path you type counts from the current folder.
pub fn default_path(relative: &str) -> PathBuf {
    match repository_root() {
        Some(root) => root.join(relative),
        None => PathBuf::from(relative),
    }
}

pub fn default_model_dir() -> PathBuf {
    default_path(DEFAULT_MODEL_DIR)
}
// ANCHOR_END: default_paths

/// `DIR/model.safetensors`, with an error that says what to do when it is missing. Paths in
/// messages are absolute, so a reader in another folder sees where we looked.
pub fn model_file(model_dir: &Path) -> Result<PathBuf> {
    let shown = std::path::absolute(model_dir).unwrap_or_else(|_| model_dir.to_path_buf());
    if model_dir.is_file() {
        bail!("{} is a file: --model takes the folder that holds config.json and model.safetensors", shown.display());
    }
    if !model_dir.is_dir() && model_dir == default_model_dir() {
        bail!(
            "model directory {} does not exist. Download the weights (accept Meta's licence on the \
             model's page first, then `hf auth login`; `hf` comes with the Python package huggingface_hub) with\n  \
             hf download meta-llama/Llama-3.2-1B-Instruct --local-dir {}\n\
             or write a synthetic checkpoint with\n  \
             cargo x synth --config 1b --out models/synthetic-1b   (then pass --model models/synthetic-1b)",
            shown.display(),
            shown.display()
        );
    }
    if !model_dir.is_dir() {
        bail!("model directory {} does not exist", shown.display());
    }
    let file = model_dir.join("model.safetensors");
    if !file.is_file() {
        let shown = std::path::absolute(&file).unwrap_or(file);
        bail!("{} not found (this engine reads a single model.safetensors file)", shown.display());
    }
    Ok(file)
}

/// `--header`: the header's length and its raw JSON, read by hand.
pub fn print_header(model_file: &Path) -> Result<()> {
    let file = map_file(model_file)?;
    let header = raw_header(&file).with_context(|| format!("{} is corrupt", model_file.display()))?;
    println!("header length (first 8 bytes, little-endian u64): {}", header.len());
    println!("{header}");
    Ok(())
}

// ANCHOR: table
/// The tensor table: the first layer in full, the other layers as one line.
pub fn print_table(checkpoint: &Checkpoint, config: &Config) {
    let mib = |bytes: usize| bytes as f64 / (1024.0 * 1024.0);
    let shape = |s: &[usize]| s.iter().map(usize::to_string).collect::<Vec<_>>().join(" x ");
    let is_later_layer = |name: &str| name.starts_with("model.layers.") && !name.starts_with("model.layers.0.");
    let last_of_layer_0 = layer_tensor_name(0, LAYER_TENSORS[LAYER_TENSORS.len() - 1]);
    println!("{:<48} {:>14} {:>10}", "tensor", "shape", "MiB");
    for entry in &checkpoint.tensors {
        if is_later_layer(&entry.name) {
            continue;
        }
        println!("{:<48} {:>14} {:>10.3}", entry.name, shape(&entry.shape), mib(entry.bytes.len()));
        if entry.name == last_of_layer_0 && config.num_hidden_layers > 1 {
            let later: usize =
                checkpoint.tensors.iter().filter(|t| is_later_layer(&t.name)).map(|t| t.bytes.len()).sum();
            let label = match config.num_hidden_layers - 1 {
                1 => "layer 1: the same 9 tensors".to_string(),
                last => format!("layers 1 to {last}: the same 9 tensors each"),
            };
            println!("{label:<48} {:>14} {:>10.3}", "", mib(later));
        }
    }
    let total_bytes: usize = checkpoint.tensors.iter().map(|t| t.bytes.len()).sum();
    let label = format!("total: {} tensors, {} parameters", checkpoint.tensors.len(), total_bytes / 2);
    println!("{label:<48} {:>14} {:>10.3}", "", mib(total_bytes));
}
// ANCHOR_END: table
