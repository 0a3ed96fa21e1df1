//! The binary on real files (a tiny synthetic checkpoint) and on broken ones. These run
//! with `--no-gpu`, so CI needs no GPU; `cargo x gpu-check` runs the GPU path.

use std::path::Path;
use std::process::{Command, Output};

use llama_reference::synth::{SynthConfig, SynthOptions, write_checkpoint, write_checkpoint_with};
use safetensors::{Dtype, tensor::TensorView};

/// Runs this chapter's binary in its package folder (inside the repository), with the
/// tokenizer `cargo x fetch-tokenizer` downloads.
fn run_binary(args: &[&str]) -> Output {
    run_binary_in(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}

/// Runs this chapter's binary in the folder `dir`, with the downloaded tokenizer.
fn run_binary_in(dir: &Path, args: &[&str]) -> Output {
    let tokenizer = std::env::var_os("LLAMA_TOKENIZER")
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tokenizer.model").into());
    Command::new(env!(concat!("CARGO_BIN_EXE_", env!("CARGO_PKG_NAME"))))
        .current_dir(dir)
        .args(args)
        .env("LLAMA_TOKENIZER", tokenizer)
        .output()
        .unwrap()
}

fn run_no_gpu(model: &Path) -> Output {
    run_binary(&["--model", model.to_str().unwrap(), "--no-gpu", "Hi"])
}

/// Asserts a clean failure: non-zero exit, one `error:` line containing `expected`, no panic.
fn assert_fails_with(output: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "should fail; stderr: {stderr}");
    assert_eq!(output.status.code(), Some(1), "should exit with 1, not crash; stderr: {stderr}");
    assert!(stderr.starts_with("error: "), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    assert!(stderr.contains(expected), "expected {expected:?} in: {stderr}");
}

fn tiny_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(SynthConfig::Tiny, 1, dir.path()).unwrap();
    dir
}

/// Rewrites model.safetensors with one tensor replaced by `(dtype, shape, bytes)`, or removed.
fn rewrite_tensor(model: &Path, name: &str, replacement: Option<(Dtype, Vec<usize>, Vec<u8>)>) {
    let path = model.join("model.safetensors");
    let original = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&original).unwrap();
    let mut tensors: Vec<(String, TensorView)> = Vec::new();
    for (tensor_name, view) in file.tensors() {
        if tensor_name != name {
            tensors.push((tensor_name, view));
        }
    }
    if let Some((dtype, shape, bytes)) = &replacement {
        tensors.push((name.to_string(), TensorView::new(*dtype, shape.clone(), bytes).unwrap()));
    }
    let rewritten = safetensors::serialize(tensors, None).unwrap();
    std::fs::write(&path, rewritten).unwrap();
}

#[test]
fn validates_a_tiny_checkpoint_and_prints_the_table() {
    let model = tiny_model();
    let output = run_binary(&["--model", model.path().to_str().unwrap(), "--no-gpu", "--verbose", "Hi"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("20 tensors, all BF16"), "{stdout}");
    assert!(stdout.contains("model.embed_tokens.weight") && stdout.contains("128256 x 512"), "{stdout}");
    assert!(stdout.contains("model.layers.0.mlp.down_proj.weight") && stdout.contains("512 x 1024"), "{stdout}");
    assert!(stdout.contains("total: 20 tensors"), "{stdout}");
}

#[test]
fn without_verbose_no_gpu_prints_the_summary_only() {
    let model = tiny_model();
    let output = run_binary(&["--model", model.path().to_str().unwrap(), "--no-gpu", "Hi"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("20 tensors, all BF16"), "{stdout}");
    assert!(!stdout.contains("model.embed_tokens.weight"), "{stdout}");
}

#[test]
fn a_sharded_checkpoint_runs_like_one_file() {
    let (single, sharded) = (tiny_model(), tempfile::tempdir().unwrap());
    let options = SynthOptions { shard_bytes: Some(4_000_000), ..Default::default() };
    write_checkpoint_with(SynthConfig::Tiny, 1, sharded.path(), &options).unwrap();
    let run = |dir: &Path| {
        let output = run_binary(&["--model", dir.to_str().unwrap(), "--no-gpu", "--verbose", "Hi"]);
        assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    let (one, many) = (run(single.path()), run(sharded.path()));
    let files = many.lines().find(|line| line.starts_with("files   ")).expect("a line about the shards");
    assert!(files.contains("shards listed in model.safetensors.index.json") && files.ends_with("20 tensors, all BF16"));
    // Past the model and file lines, the output is the same: the same tensors, the same table.
    let after_files = |out: &str| out.lines().skip(4).collect::<Vec<_>>().join("\n");
    assert_eq!(after_files(&one), after_files(&many));
}

#[test]
fn header_flag_prints_the_raw_json_header() {
    let model = tiny_model();
    let output = run_binary(&["--model", model.path().to_str().unwrap(), "--header"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    let mut lines = stdout.lines();
    let length_line = lines.next().unwrap();
    let json = lines.next().unwrap();
    assert!(length_line.ends_with(&json.len().to_string()), "{length_line} vs {} bytes", json.len());
    let parsed: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(parsed["model.norm.weight"]["dtype"], "BF16");
}

/// A folder laid out like a checkout of the repository (`chapters/07-mlp/`, `models/`),
/// without weights.
fn fake_checkout() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("chapters/07-mlp")).unwrap();
    std::fs::create_dir(root.path().join("models")).unwrap();
    root
}

#[test]
fn missing_default_directory_says_how_to_get_weights() {
    // Run from a chapter's folder: the default is found from the checkout's root, and the
    // download command names that absolute folder.
    let root = fake_checkout();
    let output = run_binary_in(&root.path().join("chapters/07-mlp"), &["--no-gpu", "hi"]);
    let default = root.path().canonicalize().unwrap().join("models/llama-3.2-1b-instruct");
    assert_fails_with(&output, &format!("model directory {} does not exist", default.display()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let download = format!("hf download meta-llama/Llama-3.2-1B-Instruct --local-dir {}", default.display());
    assert!(stderr.contains(&download), "{stderr}");
    assert!(stderr.contains("huggingface_hub"));
    assert!(stderr.contains("cargo x synth --config 1b"));
}

#[test]
fn a_relative_model_path_counts_from_the_current_folder() {
    let root = fake_checkout();
    let output = run_binary_in(&root.path().join("chapters"), &["--model", "models/mine", "--no-gpu", "hi"]);
    let expected = root.path().canonicalize().unwrap().join("chapters/models/mine");
    assert_fails_with(&output, &format!("model directory {} does not exist", expected.display()));
    assert!(!String::from_utf8_lossy(&output.stderr).contains("hf download"));
}

#[test]
fn missing_other_directory_is_named_without_download_advice() {
    let output = run_no_gpu(Path::new("/nonexistent/model"));
    assert_fails_with(&output, "model directory /nonexistent/model does not exist");
    assert!(!String::from_utf8_lossy(&output.stderr).contains("hf download"));
}

#[test]
fn a_file_given_as_model_asks_for_its_folder() {
    let model = tiny_model();
    let file = model.path().join("model.safetensors");
    assert_fails_with(
        &run_binary(&["--model", file.to_str().unwrap(), "--no-gpu", "hi"]),
        "is a file: --model takes the folder",
    );
}

#[test]
fn missing_file() {
    let model = tiny_model();
    std::fs::remove_file(model.path().join("model.safetensors")).unwrap();
    assert_fails_with(&run_no_gpu(model.path()), "model.safetensors not found");
}

#[test]
fn a_bias_or_an_extra_norm_is_refused_not_ignored() {
    for name in ["model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.q_norm.weight"] {
        let model = tiny_model();
        rewrite_tensor(model.path(), name, Some((Dtype::BF16, vec![512], vec![0; 1024])));
        assert_fails_with(&run_no_gpu(model.path()), &format!("tensor {name} is not part of a Llama model"));
    }
}

#[test]
fn a_tensor_that_changes_nothing_is_noted() {
    let model = tiny_model();
    rewrite_tensor(model.path(), "model.rotary_emb.inv_freq", Some((Dtype::F32, vec![32], vec![0; 128])));
    let output = run_no_gpu(model.path());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("ignoring tensors a Llama model does not use: model.rotary_emb.inv_freq"), "{stdout}");
}

#[test]
fn truncated_file() {
    let model = tiny_model();
    let path = model.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    assert_fails_with(&run_no_gpu(model.path()), "truncated or corrupt");
    // Cut inside the header itself.
    std::fs::write(&path, &bytes[..100]).unwrap();
    assert_fails_with(&run_no_gpu(model.path()), "its first 8 bytes say a header of");
    std::fs::write(&path, &bytes[..5]).unwrap();
    assert_fails_with(&run_no_gpu(model.path()), "too short");
}

#[test]
fn corrupt_header_json() {
    let model = tiny_model();
    let path = model.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = b'['; // the header must be a JSON object
    std::fs::write(&path, &bytes).unwrap();
    assert_fails_with(&run_no_gpu(model.path()), "truncated or corrupt");
}

#[test]
fn bad_config_json() {
    let model = tiny_model();
    std::fs::write(model.path().join("config.json"), "{\"hidden_size\": 64,").unwrap();
    assert_fails_with(&run_no_gpu(model.path()), "config.json is not a valid Llama config");
    std::fs::remove_file(model.path().join("config.json")).unwrap();
    assert_fails_with(&run_no_gpu(model.path()), "cannot read");
}

#[test]
fn wrong_dtype_names_the_tensor() {
    let model = tiny_model();
    let name = "model.layers.1.mlp.up_proj.weight";
    rewrite_tensor(model.path(), name, Some((Dtype::F32, vec![128, 64], vec![0u8; 128 * 64 * 4])));
    assert_fails_with(&run_no_gpu(model.path()), &format!("tensor {name} has dtype F32, expected BF16"));
}

#[test]
fn wrong_shape_names_the_tensor() {
    let model = tiny_model();
    let name = "model.layers.0.self_attn.k_proj.weight";
    rewrite_tensor(model.path(), name, Some((Dtype::BF16, vec![64, 64], vec![0u8; 64 * 64 * 2])));
    assert_fails_with(&run_no_gpu(model.path()), &format!("tensor {name} has shape [64, 64], expected [128, 512]"));
}

#[test]
fn missing_tensor_is_named() {
    let model = tiny_model();
    rewrite_tensor(model.path(), "model.norm.weight", None);
    assert_fails_with(&run_no_gpu(model.path()), "tensor model.norm.weight is missing");
}

#[test]
fn without_a_driver_the_gpu_path_fails_cleanly() {
    // On machines with a GPU this test checks nothing new; on CI (no driver) it checks
    // that the missing library is an error, not a panic.
    // SAFETY: only probes whether the library loads.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        return;
    }
    let model = tiny_model();
    let output = run_binary(&["--model", model.path().to_str().unwrap(), "Hi"]);
    assert_fails_with(&output, "no NVIDIA driver found");
}

#[test]
fn a_prompt_longer_than_the_context_is_refused() {
    let model = tiny_model();
    let long_prompt = "hello ".repeat(3000);
    let output = run_binary(&["--model", model.path().to_str().unwrap(), "--no-gpu", &long_prompt]);
    assert_fails_with(&output, "tokens in the chat format; the context holds 2048");
}

#[test]
fn an_empty_prompt_is_refused() {
    let model = tiny_model();
    for prompt in ["", "   \n"] {
        let output = run_binary(&["--model", model.path().to_str().unwrap(), "--no-gpu", prompt]);
        assert_fails_with(&output, "the prompt is empty");
    }
}

#[test]
fn the_token_budget_must_be_a_number() {
    let model = tiny_model();
    let output = run_binary(&["--model", model.path().to_str().unwrap(), "--no-gpu", "Hi", "many"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("invalid value 'many'"));
}

#[test]
fn a_blank_prompt_is_refused_before_anything_is_loaded() {
    // No model folder at all: the prompt is refused first.
    for prompt in ["", "  \n"] {
        assert_fails_with(&run_binary(&["--model", "/nonexistent", "--no-gpu", prompt]), "the prompt is empty");
    }
}

#[test]
fn a_negative_token_budget_is_refused() {
    let output = run_binary(&["--model", "/nonexistent", "--no-gpu", "hi", "-5"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "clap's usage error; stderr: {stderr}");
    assert!(
        stderr.contains("invalid value '-5' for '[MAX_NEW_TOKENS]': a number of tokens cannot be negative"),
        "{stderr}"
    );
}

#[test]
fn a_budget_beyond_the_context_says_it_will_be_capped() {
    let model = tiny_model();
    // "hi" is 11 tokens in the chat format; the tiny model's context is 2,048.
    let output = run_binary(&["--model", model.path().to_str().unwrap(), "--no-gpu", "hi", "100000"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("MAX_NEW_TOKENS 100000 will be capped at 2038, 97962 fewer"), "{stdout}");
    let within = run_binary(&["--model", model.path().to_str().unwrap(), "--no-gpu", "hi", "2038"]);
    assert!(!String::from_utf8_lossy(&within.stdout).contains("will be capped"));
}

#[test]
fn a_head_too_large_for_the_attention_kernel_is_refused_at_start_up() {
    let model = tiny_model();
    let config = model.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains(r#""head_dim": 64"#));
    std::fs::write(&config, text.replace(r#""head_dim": 64"#, r#""head_dim": 512"#)).unwrap();
    assert_fails_with(&run_no_gpu(model.path()), "head_dim 512 is more than the attention kernel holds (256)");
}

#[test]
fn a_max_context_beyond_the_model_or_the_kernels_is_refused() {
    let model = tiny_model();
    let dir = model.path().to_str().unwrap();
    let cases = [
        ("0", "--max-context 0 leaves no room for a prompt"),
        ("200000", "--max-context 200000 is beyond the model's max_position_embeddings (131072)"),
        ("12000", "--max-context 12000 is beyond the 11968 positions the prefill attention kernel scores"),
    ];
    for (context, expected) in cases {
        assert_fails_with(&run_binary(&["--model", dir, "--no-gpu", "--max-context", context, "hi"]), expected);
    }
}

#[test]
fn a_smaller_context_caps_the_budget() {
    let model = tiny_model();
    let output =
        run_binary(&["--model", model.path().to_str().unwrap(), "--no-gpu", "--max-context", "64", "hi", "100"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    // "hi" is 11 tokens in the chat format: 64 - 11 + 1 = 54 new tokens fit.
    assert!(stdout.contains("MAX_NEW_TOKENS 100 will be capped at 54, 46 fewer: a context of 64 tokens"), "{stdout}");
}

#[test]
fn every_prompt_on_the_command_line_is_a_request_with_the_one_budget() {
    let model = tiny_model();
    let output = run_binary(&["--model", model.path().to_str().unwrap(), "--no-gpu", "hi", "7", "hello there", "bye"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("requests 3 in the chat format"), "{stdout}");
    assert!(stdout.contains("continuous batching in 32 slots"), "{stdout}");
    assert!(stdout.contains("request 0: 11 prompt tokens, up to 7 new: \"hi\""), "{stdout}");
    assert!(stdout.contains("request 2: 11 prompt tokens, up to 7 new: \"bye\""), "{stdout}");
}

#[test]
fn a_prompts_file_gives_each_request_its_budget_and_system() {
    let model = tiny_model();
    let file = model.path().join("requests.jsonl");
    let lines = ["{\"prompt\": \"hi\", \"max_new_tokens\": 3}", "", "{\"prompt\": \"hi\", \"system\": \"Be brief.\"}"];
    std::fs::write(&file, lines.join("\n")).unwrap();
    let dir = model.path().to_str().unwrap();
    let output = run_binary(&[
        "--model",
        dir,
        "--no-gpu",
        "--static",
        "--max-batch",
        "4",
        "--prompts-file",
        file.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert!(
        stdout.contains("requests 2 in the chat format") && stdout.contains("static batching in 4 slots"),
        "{stdout}"
    );
    assert!(stdout.contains("request 0: 11 prompt tokens, up to 3 new"), "{stdout}");
    // The system prompt adds its own header and text; the budget is the default, 128.
    assert!(stdout.contains("request 1: 19 prompt tokens, up to 128 new"), "{stdout}");
}

#[test]
fn a_bad_line_in_the_prompts_file_is_named_and_nothing_runs() {
    let model = tiny_model();
    let file = model.path().join("requests.jsonl");
    let mut lines: Vec<String> = (0..6).map(|i| format!("{{\"prompt\": \"request {i}\"}}")).collect();
    lines.push("{\"prompt\": \"no end\"".into());
    std::fs::write(&file, lines.join("\n")).unwrap();
    let output = run_binary(&["--model", "/nonexistent", "--prompts-file", file.to_str().unwrap()]);
    assert_fails_with(&output, &format!("{} line 7: not a request", file.display()));
    let missing = run_binary(&["--model", "/nonexistent", "--prompts-file", "/nonexistent/requests.jsonl"]);
    assert_fails_with(&missing, "cannot read the prompts file /nonexistent/requests.jsonl");
}

#[test]
fn batching_options_that_contradict_each_other_are_refused() {
    for args in [
        vec!["--static", "--continuous", "hi"],
        vec!["--prompts-file", "requests.jsonl", "hi"],
        vec!["--max-batch", "0", "hi"],
    ] {
        let output = run_binary(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: clap's usage error; stderr: {stderr}");
    }
}

#[test]
fn a_prompt_longer_than_the_context_names_its_request() {
    let model = tiny_model();
    let long = "word ".repeat(100);
    let dir = model.path().to_str().unwrap();
    let output = run_binary(&["--model", dir, "--no-gpu", "--max-context", "64", "hi", "5", &long]);
    assert_fails_with(&output, "request 1: the prompt is");
}
