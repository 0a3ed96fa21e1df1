//! Reference ≡ Hugging Face transformers.
//!
//! `python/make_golden.py` ran transformers' `LlamaForCausalLM` in fp32 on synthetic
//! checkpoints and recorded logits and greedy ids (`tests/fixtures/golden.json`). Here we
//! write the same checkpoints again and require the reference to agree: logits within
//! 1e-4 relative, greedy ids identical.

use std::collections::HashMap;
use std::path::PathBuf;

use llama_reference::rope::{FrequencyBand, frequency_band, inverse_frequencies};
use llama_reference::synth::{SynthConfig, write_checkpoint};
use llama_reference::{KvCache, LlamaConfig, Model};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    transformers: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    config: String,
    seed: u64,
    prompt_ids: Vec<u32>,
    positions: Vec<usize>,
    token_ids: Vec<usize>,
    logits: Vec<Vec<f32>>,
    greedy_ids: Vec<u32>,
}

const RELATIVE_TOLERANCE: f32 = 1e-4;

fn fixture() -> Fixture {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden.json does not parse")
}

/// Writes each (config, seed) checkpoint once and loads it.
fn models(cases: &[Case], dir: &std::path::Path) -> HashMap<(String, u64), Model> {
    let mut models = HashMap::new();
    for case in cases {
        let key = (case.config.clone(), case.seed);
        if models.contains_key(&key) {
            continue;
        }
        let model_dir = dir.join(format!("{}-{}", case.config, case.seed));
        write_checkpoint(SynthConfig::parse(&case.config).unwrap(), case.seed, &model_dir).unwrap();
        models.insert(key, Model::load(&model_dir).unwrap());
    }
    models
}

#[test]
fn reference_matches_transformers_logits_and_greedy_ids() {
    let fixture = fixture();
    assert!(fixture.cases.len() >= 4, "the fixture should hold several cases");
    let dir = tempfile::tempdir().unwrap();
    let models = models(&fixture.cases, dir.path());
    let mut worst_relative = 0f32;
    for case in &fixture.cases {
        let model = &models[&(case.config.clone(), case.seed)];
        let label = format!("{} seed {} ({} prompt tokens)", case.config, case.seed, case.prompt_ids.len());

        let hidden = model.forward(&case.prompt_ids, &mut KvCache::new(&model.config)).unwrap();
        for (position, expected) in case.positions.iter().zip(&case.logits) {
            let logits = model.logits(&hidden.rows_slice(*position, position + 1)).data;
            let ours: Vec<f32> = case.token_ids.iter().map(|&id| logits[id]).collect();
            let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = ours.iter().zip(expected).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            worst_relative = worst_relative.max(worst / scale);
            assert!(
                worst <= RELATIVE_TOLERANCE * scale,
                "{label}, position {position}: logits differ by {worst:e} (largest |logit| {scale}) from transformers {}",
                fixture.transformers
            );
        }

        let stops = model.config.eos_token_ids.clone();
        let greedy = model.greedy(&case.prompt_ids, case.greedy_ids.len(), &stops).unwrap();
        assert_eq!(greedy, case.greedy_ids, "{label}: greedy ids differ from transformers");
    }
    eprintln!(
        "{} cases agree with transformers {}; worst logit difference {worst_relative:.1e} relative",
        fixture.cases.len(),
        fixture.transformers
    );
}

/// With head_dim 64, the real Llama 3 RoPE parameters put the 32 frequencies of a head in
/// all three bands of the scaling (kept, blended, divided), so the fixtures test each branch.
#[test]
fn tiny_head_dim_exercises_all_three_rope_bands() {
    let config = LlamaConfig::from_json(&SynthConfig::Tiny.config_json()).unwrap();
    assert_eq!(config.head_dim, 64);
    let scaling = config.rope.llama3_scaling.expect("tiny config uses llama3 scaling");
    let plain = llama_reference::config::RopeConfig { theta: config.rope.theta, llama3_scaling: None };
    let bands: Vec<FrequencyBand> =
        inverse_frequencies(&plain, config.head_dim).iter().map(|&f| frequency_band(f, &scaling)).collect();
    for band in [FrequencyBand::High, FrequencyBand::Medium, FrequencyBand::Low] {
        assert!(bands.contains(&band), "no frequency in the {band:?} band: {bands:?}");
    }
}
