//! The CPU reference on its own: given a model folder, the best next token after "Say hello."
//! and 16 greedy tokens. `cargo run --release -p llama-reference --example greedy -- DIR`

use anyhow::Context;
use llama_reference::Model;
use llama_reference::model::argmax;

fn main() -> anyhow::Result<()> {
    let folder = std::env::args().nth(1).context("usage: greedy MODEL_FOLDER")?;
    let model = Model::load(folder.as_ref())?;
    // "Say hello." in the chat format, as `ch07-mlp chat 'Say hello.'` prints it.
    let prompt = [128000, 128006, 882, 128007, 271, 46864, 24748, 13, 128009, 128006, 78191, 128007, 271];
    let logits = model.last_logits(&prompt)?;
    let best = argmax(&logits);
    println!("{} logits; the best is token {best}, at {:.3}", logits.len(), logits[best as usize]);
    let tokens = model.greedy(&prompt, 16, &model.config.eos_token_ids)?;
    println!("greedy: {tokens:?}");
    Ok(())
}
