//! Synthetic checkpoints: the real layout, deterministic, and a planted circuit whose greedy
//! output depends on the prompt, on a token 40 positions back, and ends some prompts early.

use std::collections::BTreeMap;
use std::path::Path;

use llama_reference::synth::circuit::{BEGIN_OF_TEXT, END_AFTER, END_OF_TURN};
use llama_reference::synth::{Circuit, SynthConfig, SynthOptions, write_checkpoint, write_checkpoint_with};
use llama_reference::{Checkpoint, LlamaConfig, Model};

const HF_LAYER_TENSORS: [&str; 9] = [
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

/// Llama 3's stop tokens, as the engine uses them.
const STOP_TOKENS: [u32; 3] = [128_001, 128_008, 128_009];

/// Natural prompts' user tokens, as Meta's tokenizer encodes them (`ch07-mlp chat PROMPT`).
const PROMPTS: [(&str, &[u32]); 10] = [
    ("Say hello.", &[46864, 24748, 13]),
    ("Write a haiku about GPUs.", &[8144, 264, 6520, 39342, 922, 71503, 13]),
    ("What is the capital of France?", &[3923, 374, 279, 6864, 315, 9822, 30]),
    ("Explain why the sky is blue.", &[849, 21435, 3249, 279, 13180, 374, 6437, 13]),
    ("List three prime numbers.", &[861, 2380, 10461, 5219, 13]),
    ("Translate 'good morning' into Spanish.", &[28573, 364, 19045, 6693, 6, 1139, 15506, 13]),
    ("How do I boil an egg?", &[4438, 656, 358, 44790, 459, 19151, 30]),
    ("Give me a word that rhymes with cat.", &[36227, 757, 264, 3492, 430, 22408, 79809, 449, 8415, 13]),
    ("Tell me about it.", &[41551, 757, 922, 433, 13]),
    ("Can you help me with this?", &[6854, 499, 1520, 757, 449, 420, 30]),
];

/// `user` in Llama 3's chat format, ending with the open assistant header.
fn chat(user: &[u32]) -> Vec<u32> {
    let mut ids = vec![BEGIN_OF_TEXT, 128_006, 882, 128_007, 271];
    ids.extend(user);
    ids.extend([128_009, 128_006, 78191, 128_007, 271]);
    ids
}

fn tiny_model(seed: u64) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(SynthConfig::Tiny, seed, dir.path()).unwrap();
    let model = Model::load(dir.path()).unwrap();
    (dir, model)
}

/// Greedy decoding by the model, each step's lead of the winning logit over the runner-up
/// as a fraction of the winning logit.
fn greedy_with_margins(model: &Model, prompt: &[u32], max_new_tokens: usize) -> (Vec<u32>, Vec<f32>) {
    let tokens = model.greedy(prompt, max_new_tokens, &STOP_TOKENS).unwrap();
    let margins = model
        .step_logits(prompt, &tokens)
        .unwrap()
        .iter()
        .map(|logits| {
            let mut sorted = logits.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            (sorted[0] - sorted[1]) / sorted[0]
        })
        .collect();
    (tokens, margins)
}

/// A user message of `len` loud tokens (ids from 1000 on), varied by `salt`.
fn loud_words(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| 1000 + (i * 7919 + salt * 104_729) % 120_000).collect()
}

#[test]
fn tiny_checkpoint_has_hugging_face_names_and_loads() {
    let dir = tempfile::tempdir().unwrap();
    let summary = write_checkpoint(SynthConfig::Tiny, 3, dir.path()).unwrap();
    assert_eq!(summary.tensors, 2 + 9 * 2);
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    for name in ["model.embed_tokens.weight", "model.norm.weight"] {
        assert!(checkpoint.contains(name), "{name} missing");
    }
    for layer in 0..2 {
        for tensor in HF_LAYER_TENSORS {
            let name = format!("model.layers.{layer}.{tensor}.weight");
            assert!(checkpoint.contains(&name), "{name} missing");
        }
    }
    assert!(!checkpoint.contains("lm_head.weight"), "the tiny model ties its LM head");
    let model = Model::load(dir.path()).unwrap();
    assert!(model.lm_head.is_none());

    let untied = tempfile::tempdir().unwrap();
    write_checkpoint(SynthConfig::TinyUntied, 3, untied.path()).unwrap();
    assert!(Model::load(untied.path()).unwrap().lm_head.is_some());
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let [a, b, c] = [(); 3].map(|_| tempfile::tempdir().unwrap());
    write_checkpoint(SynthConfig::Tiny, 11, a.path()).unwrap();
    write_checkpoint(SynthConfig::Tiny, 11, b.path()).unwrap();
    write_checkpoint(SynthConfig::Tiny, 12, c.path()).unwrap();
    let read = |dir: &tempfile::TempDir| std::fs::read(dir.path().join("model.safetensors")).unwrap();
    assert_eq!(read(&a), read(&b));
    assert_ne!(read(&a), read(&c));
}

/// The model does what the rule says, on natural and long prompts, with a winning logit
/// that leads by a fifth or more at every step (bf16 rounding moves logits by well under 1%).
#[test]
fn greedy_follows_the_planted_rule_with_wide_margins() {
    for seed in [1, 2] {
        let (_dir, model) = tiny_model(seed);
        let circuit = Circuit::new(&model.config, seed).unwrap();
        let long = [loud_words(60, seed as u32), vec![13]].concat();
        let prompts = PROMPTS.iter().map(|(_, user)| chat(user)).chain([chat(&long)]);
        for prompt in prompts {
            let (tokens, margins) = greedy_with_margins(&model, &prompt, 24);
            assert_eq!(tokens, circuit.greedy(&prompt, 24, &STOP_TOKENS), "seed {seed}, prompt {prompt:?}");
            let worst = margins.iter().copied().fold(f32::INFINITY, f32::min);
            assert!(worst > 0.2, "seed {seed}: a winning logit leads by only {worst:.3} of itself ({prompt:?})");
        }
    }
}

#[test]
fn different_prompts_give_different_continuations() {
    let (_dir, model) = tiny_model(3);
    let mut continuations: Vec<Vec<u32>> =
        PROMPTS[..8].iter().map(|(_, user)| model.greedy(&chat(user), 16, &STOP_TOKENS).unwrap()).collect();
    continuations.sort();
    continuations.dedup();
    assert!(continuations.len() >= 6, "8 prompts gave only {} different continuations", continuations.len());
}

/// Two prompts that differ only in the token 40 positions before the last one: older than
/// two 16-token pages of a paged cache.
#[test]
fn a_token_forty_positions_back_changes_the_continuation() {
    let (_dir, model) = tiny_model(4);
    let words = loud_words(50, 9);
    let prompt = chat(&words);
    let far_back = prompt.len() - 1 - 40;
    assert!((5..5 + words.len()).contains(&far_back), "position {far_back} is not in the user's words");
    let mut changed = prompt.clone();
    changed[far_back] = 99_999;
    let a = model.greedy(&prompt, 16, &STOP_TOKENS).unwrap();
    let b = model.greedy(&changed, 16, &STOP_TOKENS).unwrap();
    assert_ne!(a, b, "changing position {far_back} of {} changed nothing", prompt.len());
}

/// A prompt whose last words are quiet runs down the quiet path and ends its turn.
#[test]
fn a_prompt_ending_in_quiet_words_stops_at_end_of_turn() {
    let (_dir, model) = tiny_model(5);
    for (text, user) in &PROMPTS[8..] {
        let generated = model.greedy(&chat(user), 50, &STOP_TOKENS).unwrap();
        assert_eq!(generated.len(), END_AFTER, "{text:?} gave {generated:?}");
        assert_eq!(generated.last(), Some(&END_OF_TURN), "{text:?} gave {generated:?}");
    }
}

/// The tensor names of one safetensors file.
fn tensor_names(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = tensors.names().into_iter().map(str::to_string).collect();
    names.sort();
    names
}

/// Every safetensors file in `dir`, by name.
fn safetensors_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".safetensors"))
        .collect();
    names.sort();
    names
}

/// The same folder rewritten as small shards: the index names every tensor once, each shard
/// holds exactly the tensors it is named for, the model is the same, and the single file of
/// the first write is gone (other files stay).
#[test]
fn small_shards_have_a_complete_index_and_load_as_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "kept").unwrap();
    let single = write_checkpoint(SynthConfig::Tiny, 6, dir.path()).unwrap();
    assert_eq!(single.files, 1);
    let prompt = chat(PROMPTS[1].1);
    let from_one_file = Model::load(dir.path()).unwrap().greedy(&prompt, 8, &STOP_TOKENS).unwrap();

    let options = SynthOptions { shard_bytes: Some(4_000_000), ..SynthOptions::default() };
    let sharded = write_checkpoint_with(SynthConfig::Tiny, 6, dir.path(), &options).unwrap();
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap())
            .unwrap();
    assert_eq!(index["metadata"]["total_size"].as_u64(), Some(single.bytes));
    let mut by_shard: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (tensor, shard) in index["weight_map"].as_object().unwrap() {
        by_shard.entry(shard.as_str().unwrap().to_string()).or_default().push(tensor.clone());
    }
    let count = by_shard.len();
    assert!(count > 2 && sharded.files == count, "{count} shards, {} files", sharded.files);
    let expected_names: Vec<String> = (1..=count).map(|i| format!("model-{i:05}-of-{count:05}.safetensors")).collect();
    assert_eq!(by_shard.keys().cloned().collect::<Vec<_>>(), expected_names);
    assert_eq!(safetensors_files(dir.path()), expected_names, "model.safetensors must be gone");
    let indexed: usize = by_shard.values().map(Vec::len).sum();
    assert_eq!((indexed, sharded.tensors, sharded.bytes), (single.tensors, single.tensors, single.bytes));
    for (shard, mut tensors) in by_shard {
        tensors.sort();
        assert_eq!(tensor_names(&dir.path().join(&shard)), tensors, "{shard}");
    }
    assert_eq!(Model::load(dir.path()).unwrap().greedy(&prompt, 8, &STOP_TOKENS).unwrap(), from_one_file);
    assert!(dir.path().join("notes.txt").exists());
}

/// One layer: the widths stay, config.json says 1 layer, and layer 0 alone follows the rule.
#[test]
fn one_layer_keeps_the_widths_and_the_planted_rule() {
    let dir = tempfile::tempdir().unwrap();
    let options = SynthOptions { layers: Some(1), ..SynthOptions::default() };
    let summary = write_checkpoint_with(SynthConfig::Tiny, 8, dir.path(), &options).unwrap();
    assert_eq!((summary.layers, summary.tensors, summary.files), (1, 2 + 9, 1));
    let config = LlamaConfig::from_file(&dir.path().join("config.json")).unwrap();
    let mut full = LlamaConfig::from_json(&SynthConfig::Tiny.config_json()).unwrap();
    full.num_hidden_layers = 1;
    assert_eq!(config, full);
    let model = Model::load(dir.path()).unwrap();
    assert_eq!(model.layers.len(), 1);
    let circuit = Circuit::new(&model.config, 8).unwrap();
    let long = [loud_words(50, 8), vec![13]].concat();
    for prompt in [chat(PROMPTS[8].1), chat(&long)] {
        let (tokens, margins) = greedy_with_margins(&model, &prompt, 24);
        assert_eq!(tokens, circuit.greedy(&prompt, 24, &STOP_TOKENS), "prompt {prompt:?}");
        let worst = margins.iter().copied().fold(f32::INFINITY, f32::min);
        assert!(worst > 0.2, "a winning logit leads by only {worst:.3} of itself ({prompt:?})");
    }
}

/// The same properties on the 1B shapes (2.5 GB written, 5 GB of f32 in memory, minutes on
/// two cores): `cargo test --release -p llama-reference --test synth -- --ignored`.
#[test]
#[ignore]
fn one_b_follows_the_rule_depends_on_the_prompt_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(SynthConfig::OneB, 7, dir.path()).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let circuit = Circuit::new(&model.config, 7).unwrap();
    let mut continuations = Vec::new();
    let long = [loud_words(50, 3), vec![13]].concat();
    for prompt in PROMPTS.iter().map(|(_, user)| chat(user)).chain([chat(&long)]) {
        let (tokens, margins) = greedy_with_margins(&model, &prompt, 24);
        assert_eq!(tokens, circuit.greedy(&prompt, 24, &STOP_TOKENS), "prompt {prompt:?}");
        let worst = margins.iter().copied().fold(f32::INFINITY, f32::min);
        assert!(worst > 0.2, "a winning logit leads by only {worst:.3} of itself ({prompt:?})");
        continuations.push(tokens);
    }
    assert!(continuations[8].len() == END_AFTER && continuations[8].last() == Some(&END_OF_TURN));
    let mut first_eight = continuations[..8].iter().map(|c| c[..16].to_vec()).collect::<Vec<_>>();
    first_eight.sort();
    first_eight.dedup();
    assert!(first_eight.len() >= 6, "8 prompts gave only {} different continuations", first_eight.len());
    let prompt = chat(&long);
    let mut changed = prompt.clone();
    changed[prompt.len() - 1 - 40] = 99_999;
    assert_ne!(model.greedy(&prompt, 16, &STOP_TOKENS).unwrap(), model.greedy(&changed, 16, &STOP_TOKENS).unwrap());
}
