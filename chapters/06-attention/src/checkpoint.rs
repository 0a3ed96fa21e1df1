//! `model.safetensors`: an 8-byte length, a JSON header, then every tensor's raw bytes.
//!
//! ```text
//! [ u64 little-endian N ][ N bytes of JSON header ][ tensor bytes ........................ ]
//!                         {"model.norm.weight": {"dtype": "BF16", "shape": [2048],
//!                          "data_offsets": [0, 4096]}, ...}   offsets count from here ^
//! ```
//!
//! Larger models come as several such files, *shards*, and an index that says which shard
//! holds each tensor ([`crate::index`]); a [`Checkpoint`] is all of them, validated.
//!
//! We map the files into memory instead of reading them: the operating system pages bytes
//! in as the GPU copy touches them, and no second copy of the weights lives in our process.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::config::Config;
use crate::index::{INDEX_FILE, ShardIndex};

/// One tensor as the header describes it.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub name: String,
    pub shape: Vec<usize>,
    /// Which of the checkpoint's files holds it (an index into [`Checkpoint::files`]).
    pub file: usize,
    /// Where its bytes are, counted from the start of that file.
    pub bytes: Range<usize>,
}

/// One memory-mapped safetensors file: the whole model, or one shard of it.
pub struct SafetensorsFile {
    pub path: PathBuf,
    mmap: Mmap,
    pub header_len: usize,
}

/// A model's memory-mapped, validated safetensors files.
pub struct Checkpoint {
    pub files: Vec<SafetensorsFile>,
    /// Whether the files are shards listed by `model.safetensors.index.json`.
    pub sharded: bool,
    /// The tensors this engine uses, in the order of [`expected_tensors`].
    pub tensors: Vec<TensorEntry>,
    /// Names in the files that a Llama model does not use.
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
    /// Maps every file, lets the safetensors crate validate each one's structure, checks that
    /// the files and the index agree on where each tensor is, then that every tensor the
    /// config calls for is there with dtype BF16 and the right shape.
    pub fn open(model: &ModelFiles, config: &Config) -> Result<Self> {
        let mut files = Vec::new();
        // Tensor name → (file, what its header says), over all files.
        let mut found: HashMap<String, (usize, TensorInfo)> = HashMap::new();
        for path in &model.paths {
            let mmap = map_file(path)?;
            let header_len = raw_header(&mmap).with_context(|| format!("{} is corrupt", path.display()))?.len();
            // The crate checks the JSON, every offset, and that the tensors exactly fill the file.
            let (_, metadata) = SafeTensors::read_metadata(&mmap)
                .map_err(|e| anyhow::anyhow!("{} is truncated or corrupt: {e}", path.display()))?;
            for (name, info) in metadata.tensors() {
                let (start, end) = info.data_offsets;
                // Offsets in the header count from the end of the header.
                let bytes = 8 + header_len + start..8 + header_len + end;
                let info = TensorInfo { dtype: info.dtype, shape: info.shape.clone(), bytes };
                if let Some((other, _)) = found.insert(name.clone(), (files.len(), info)) {
                    bail!("tensor {name} is in both {} and {}", model.paths[other].display(), path.display());
                }
            }
            files.push(SafetensorsFile { path: path.clone(), mmap, header_len });
        }
        if let Some((index_path, index)) = &model.index {
            check_index_agrees(index_path, index, &files, &found)?;
        }

        let mut tensors = Vec::new();
        for (name, shape) in expected_tensors(config) {
            let Some((file, info)) = found.remove(&name) else {
                match &model.index {
                    Some((index_path, _)) => bail!("tensor {name} is in no shard (nor in {})", index_path.display()),
                    None => bail!("{}: tensor {name} is missing", model.paths[0].display()),
                }
            };
            let path = files[file].path.display();
            ensure!(info.dtype == Dtype::BF16, "{path}: tensor {name} has dtype {:?}, expected BF16", info.dtype);
            ensure!(
                info.shape == shape,
                "{path}: tensor {name} has shape {:?}, expected {shape:?} from config.json",
                info.shape
            );
            tensors.push(TensorEntry { name, shape, file, bytes: info.bytes });
        }
        // What is left over is in the files but not in a Llama model. A bias or another norm
        // would change what the model computes (Qwen2's q/k/v biases, Qwen3's q_norm): running
        // without it would give a plausible, wrong answer, so it is refused. Anything else
        // (an old checkpoint's `rotary_emb.inv_freq`) is noted and left unread.
        let mut ignored: Vec<String> = found.into_keys().collect();
        ignored.sort();
        if let Some(name) = ignored.iter().find(|name| changes_the_math(name)) {
            bail!(
                "tensor {name} is not part of a Llama model, and skipping it would change the model's output \
                 (a bias or a norm): this engine runs Llama checkpoints only"
            );
        }
        Ok(Checkpoint { files, sharded: model.index.is_some(), tensors, ignored })
    }
    // ANCHOR_END: open

    /// The bytes of one tensor, straight from its file's mapping.
    pub fn bytes(&self, entry: &TensorEntry) -> &[u8] {
        &self.files[entry.file].mmap[entry.bytes.clone()]
    }

    /// One line about the files, for the run's header.
    pub fn describe(&self) -> String {
        let total: usize = self.files.iter().map(|file| file.mmap.len()).sum();
        let tensors = self.tensors.len();
        if self.sharded {
            format!(
                "files   {} shards listed in {INDEX_FILE}, {total} bytes, {tensors} tensors, all BF16",
                self.files.len()
            )
        } else {
            let header_len = self.files[0].header_len;
            format!(
                "file    {total} bytes: 8-byte length, {header_len} bytes of JSON header, {tensors} tensors, all BF16"
            )
        }
    }
}

/// A tensor's header entry, with its bytes counted from the start of its file.
struct TensorInfo {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Range<usize>,
}

// ANCHOR: check_index
/// The index must say exactly what the shards hold: each tensor it lists is in the shard it
/// names, and each tensor a shard holds is listed. A disagreement means a shard from another
/// download, or an edited index; either way, loading would guess.
fn check_index_agrees(
    index_path: &Path,
    index: &ShardIndex,
    files: &[SafetensorsFile],
    found: &HashMap<String, (usize, TensorInfo)>,
) -> Result<()> {
    let shard = |file: usize| &index.shards[file];
    let mut listed: Vec<(&String, &usize)> = index.shard_of.iter().collect();
    listed.sort();
    for (name, &file) in listed {
        match found.get(name) {
            None => bail!("{} lists tensor {name} in {}, which does not hold it", index_path.display(), shard(file)),
            Some((actual, _)) if *actual != file => bail!(
                "{} lists tensor {name} in {}, but it is in {}",
                index_path.display(),
                shard(file),
                files[*actual].path.display()
            ),
            Some(_) => {}
        }
    }
    let mut unlisted: Vec<&String> = found.keys().filter(|name| !index.shard_of.contains_key(*name)).collect();
    unlisted.sort();
    if let Some(name) = unlisted.first() {
        let (file, _) = &found[*name];
        bail!("{} holds tensor {name}, which {} does not list", files[*file].path.display(), index_path.display());
    }
    Ok(())
}
// ANCHOR_END: check_index

/// Maps a file into our address space, read-only.
pub fn map_file(path: &Path) -> Result<Mmap> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: we only read the mapping, and nobody should rewrite model files under us.
    unsafe { Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))
}

/// Whether a tensor a Llama model does not have would take part in the arithmetic: a bias
/// (Llama's projections have none) or a norm beyond Llama's two per layer and the final one.
fn changes_the_math(name: &str) -> bool {
    name.ends_with(".bias") || name.contains("norm")
}

// ANCHOR: raw_header
/// Reads the header by hand: 8 bytes of little-endian length, then that many bytes of JSON.
pub fn raw_header(file: &[u8]) -> Result<&str> {
    ensure!(file.len() >= 8, "file is {} bytes long, too short for the 8-byte header length", file.len());
    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap());
    let end = 8u64.checked_add(header_len).filter(|&end| end <= file.len() as u64);
    let Some(end) = end else {
        bail!(
            "its first 8 bytes say a header of {header_len} bytes follows, but the file has only {} bytes after them \
             (truncated?)",
            file.len() - 8
        );
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

// ANCHOR: model_files
/// The files that hold a model's tensors.
pub struct ModelFiles {
    /// `model.safetensors.index.json` and what it says, for a sharded checkpoint.
    pub index: Option<(PathBuf, ShardIndex)>,
    /// `model.safetensors`, or every shard the index names, in the index's order.
    pub paths: Vec<PathBuf>,
}

/// Finds `DIR/model.safetensors`, or `DIR/model.safetensors.index.json` and the shards it
/// names, with an error that says what to do when they are missing. Paths in messages are
/// absolute, so a reader in another folder sees where we looked.
pub fn model_files(model_dir: &Path) -> Result<ModelFiles> {
    let shown = std::path::absolute(model_dir).unwrap_or_else(|_| model_dir.to_path_buf());
    if model_dir.is_file() {
        bail!(
            "{} is a file: --model takes the folder that holds config.json and the safetensors files",
            shown.display()
        );
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
    let (single, index_path) = (shown.join("model.safetensors"), shown.join(INDEX_FILE));
    match (single.is_file(), index_path.is_file()) {
        (true, false) => Ok(ModelFiles { index: None, paths: vec![single] }),
        (false, true) => {
            let index = ShardIndex::read(&index_path)?;
            let paths: Vec<PathBuf> = index.shards.iter().map(|shard| shown.join(shard)).collect();
            if let Some(missing) = paths.iter().find(|path| !path.is_file()) {
                bail!("{} is missing: {INDEX_FILE} lists it as a shard", missing.display());
            }
            Ok(ModelFiles { index: Some((index_path, index)), paths })
        }
        (true, true) => bail!(
            "{} holds both model.safetensors and {INDEX_FILE}: keep the one that belongs to config.json",
            shown.display()
        ),
        (false, false) => bail!("{} not found (nor {INDEX_FILE} for a sharded checkpoint)", single.display()),
    }
}
// ANCHOR_END: model_files

/// `--header`: each file's header length and its raw JSON, read by hand.
pub fn print_header(model: &ModelFiles) -> Result<()> {
    for path in &model.paths {
        let file = map_file(path)?;
        let header = raw_header(&file).with_context(|| format!("{} is corrupt", path.display()))?;
        if model.index.is_some() {
            println!("{}:", path.display());
        }
        println!("header length (first 8 bytes, little-endian u64): {}", header.len());
        println!("{header}");
    }
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

#[cfg(test)]
mod tests {
    //! The sharded loader on tiny checkpoints split into small shards, and on every way a
    //! set of shards and its index can disagree.

    use std::collections::BTreeMap;
    use std::sync::OnceLock;

    use llama_reference::synth::{SynthConfig, SynthOptions, write_checkpoint_with};
    use safetensors::tensor::TensorView;

    use super::*;

    /// A copy, for one test to edit, of a tiny checkpoint in shards of at most 4 MB (the
    /// embedding alone is 131 MB, so it has a shard to itself), or in one file. Each layout
    /// is written once per test run and copied, which is much faster than writing it again.
    fn tiny(sharded: bool) -> tempfile::TempDir {
        static WRITTEN: [OnceLock<tempfile::TempDir>; 2] = [OnceLock::new(), OnceLock::new()];
        let original = WRITTEN[sharded as usize].get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let options = SynthOptions { shard_bytes: sharded.then_some(4_000_000), ..Default::default() };
            write_checkpoint_with(SynthConfig::Tiny, 1, dir.path(), &options).unwrap();
            dir
        });
        let copy = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(original.path()).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
        }
        copy
    }

    fn open(dir: &Path) -> Result<Checkpoint> {
        let config = Config::from_file(&dir.join("config.json"))?;
        Checkpoint::open(&model_files(dir)?, &config)
    }

    fn error(dir: &Path) -> String {
        format!("{:#}", open(dir).err().expect("the checkpoint should be refused"))
    }

    fn weight_map(dir: &Path) -> BTreeMap<String, String> {
        let index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(INDEX_FILE)).unwrap()).unwrap();
        serde_json::from_value(index["weight_map"].clone()).unwrap()
    }

    fn write_weight_map(dir: &Path, map: &BTreeMap<String, String>) {
        let index = serde_json::json!({ "metadata": {}, "weight_map": map });
        std::fs::write(dir.join(INDEX_FILE), index.to_string()).unwrap();
    }

    /// Rewrites one safetensors file keeping the tensors `keep` accepts, plus `extra` ones.
    fn rewrite(path: &Path, keep: impl Fn(&str) -> bool, extra: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>) {
        let original = std::fs::read(path).unwrap();
        let file = SafeTensors::deserialize(&original).unwrap();
        let mut tensors: Vec<(String, TensorView)> =
            file.tensors().into_iter().filter(|(name, _)| keep(name)).collect();
        for (name, dtype, shape, bytes) in &extra {
            tensors.push((name.clone(), TensorView::new(*dtype, shape.clone(), bytes).unwrap()));
        }
        std::fs::write(path, safetensors::serialize(tensors, None).unwrap()).unwrap();
    }

    #[test]
    fn shards_hold_the_same_tensors_as_one_file() {
        let (single, sharded) = (tiny(false), tiny(true));
        let (one, many) = (open(single.path()).unwrap(), open(sharded.path()).unwrap());
        assert!(!one.sharded && many.sharded && many.files.len() > 2, "{} shards", many.files.len());
        assert!(many.describe().contains("shards listed in model.safetensors.index.json, "), "{}", many.describe());
        assert_eq!(one.tensors.len(), many.tensors.len());
        for (a, b) in one.tensors.iter().zip(&many.tensors) {
            assert_eq!((&a.name, &a.shape), (&b.name, &b.shape));
            assert!(one.bytes(a) == many.bytes(b), "{} differs", a.name);
        }
        // Every shard holds some of them.
        for file in 0..many.files.len() {
            assert!(many.tensors.iter().any(|t| t.file == file), "shard {file} is unused");
        }
    }

    #[test]
    fn a_missing_shard_is_named() {
        let dir = tiny(true);
        let shard = weight_map(dir.path())["model.norm.weight"].clone();
        std::fs::remove_file(dir.path().join(&shard)).unwrap();
        assert!(error(dir.path()).contains(&format!("{shard} is missing: {INDEX_FILE} lists it as a shard")));
    }

    #[test]
    fn a_listed_tensor_its_shard_does_not_hold() {
        let dir = tiny(true);
        let shard = weight_map(dir.path())["model.norm.weight"].clone();
        rewrite(&dir.path().join(&shard), |name| name != "model.norm.weight", vec![]);
        let message = error(dir.path());
        assert!(
            message.contains(&format!("lists tensor model.norm.weight in {shard}, which does not hold it")),
            "{message}"
        );
    }

    #[test]
    fn an_index_pointing_to_the_wrong_shard() {
        let dir = tiny(true);
        let mut map = weight_map(dir.path());
        let (right, wrong) = (map["model.norm.weight"].clone(), map["model.embed_tokens.weight"].clone());
        assert_ne!(right, wrong);
        map.insert("model.norm.weight".into(), wrong.clone());
        write_weight_map(dir.path(), &map);
        let message = error(dir.path());
        assert!(message.contains(&format!("lists tensor model.norm.weight in {wrong}, but it is in ")), "{message}");
        assert!(message.ends_with(&right), "{message}");
    }

    #[test]
    fn a_tensor_in_two_shards() {
        let dir = tiny(true);
        let map = weight_map(dir.path());
        let other = map.values().find(|shard| **shard != map["model.norm.weight"]).unwrap().clone();
        let copy = ("model.norm.weight".to_string(), Dtype::BF16, vec![512], vec![0u8; 1024]);
        rewrite(&dir.path().join(&other), |_| true, vec![copy]);
        let message = error(dir.path());
        assert!(message.starts_with("tensor model.norm.weight is in both "), "{message}");
    }

    #[test]
    fn a_tensor_the_index_does_not_list() {
        let dir = tiny(true);
        let mut map = weight_map(dir.path());
        map.remove("model.layers.1.mlp.up_proj.weight");
        write_weight_map(dir.path(), &map);
        let message = error(dir.path());
        assert!(message.contains("holds tensor model.layers.1.mlp.up_proj.weight, which "), "{message}");
        assert!(message.ends_with(&format!("{INDEX_FILE} does not list")), "{message}");
    }

    #[test]
    fn a_tensor_in_neither_shards_nor_index() {
        let dir = tiny(true);
        let mut map = weight_map(dir.path());
        let shard = map.remove("model.norm.weight").unwrap();
        write_weight_map(dir.path(), &map);
        rewrite(&dir.path().join(&shard), |name| name != "model.norm.weight", vec![]);
        assert!(error(dir.path()).starts_with("tensor model.norm.weight is in no shard (nor in "));
    }

    #[test]
    fn both_layouts_in_one_folder_is_ambiguous() {
        let dir = tiny(true);
        std::fs::write(dir.path().join("model.safetensors"), b"stale").unwrap();
        assert!(error(dir.path()).contains("holds both model.safetensors and model.safetensors.index.json"));
    }
}
