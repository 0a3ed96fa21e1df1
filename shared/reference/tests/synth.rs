//! Synthetic checkpoints: the real layout, deterministic, and with usable greedy output.

use llama_reference::synth::{SynthConfig, planted_successor, write_checkpoint};
use llama_reference::{Checkpoint, Model};

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

#[test]
fn greedy_output_is_not_degenerate() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(SynthConfig::Tiny, 5, dir.path()).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let generated = model.greedy(&[128_000, 9906, 11, 1917, 0], 16, &[]).unwrap();
    let mut distinct = generated.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(generated.len(), 16);
    assert!(distinct.len() >= 8, "only {} distinct ids in {generated:?}", distinct.len());
}

#[test]
fn greedy_follows_the_planted_successors() {
    // The planted circuit decides the first token: the successor of the prompt's last token.
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(SynthConfig::Tiny, 6, dir.path()).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let prompt = [128_000, 791, 4320, 374];
    let first = model.greedy(&prompt, 1, &[]).unwrap()[0];
    assert_eq!(first, planted_successor(&model.config, 6, 374));
}
