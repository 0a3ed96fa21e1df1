//! What the chapter prints about the values it computed: a few numbers of each token's row,
//! and how much the attention sublayer changed each one.

use anyhow::Result;

use crate::tokenizer::Tokenizer;
use crate::tokenizer::commands;

/// Each token with the first and last few values of its row.
pub fn show_rows(title: &str, tokenizer: &Tokenizer, ids: &[u32], rows: &[f32], hidden: usize) -> Result<()> {
    println!();
    println!("{title}: {} tokens x {hidden} values", ids.len());
    for (&id, row) in ids.iter().zip(rows.chunks_exact(hidden)) {
        let piece = commands::show_piece(tokenizer.token_bytes(id)?);
        let values = |vals: &[f32]| vals.iter().map(|v| format!("{v:>8.4}")).collect::<Vec<_>>().join(" ");
        println!("{id:>8} {piece:<22} [{} ... {}]", values(&row[..4]), values(&row[hidden - 2..]));
    }
    Ok(())
}

// ANCHOR: show_attention_update
/// For each token: how large its row is before the sublayer, and how much attention
/// changed it (root mean squares), with the first values after.
pub fn show_attention_update(
    tokenizer: &Tokenizer,
    ids: &[u32],
    before: &[f32],
    after: &[f32],
    hidden: usize,
) -> Result<()> {
    let rms = |values: &[f32]| (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
    println!();
    println!("layer 0 attention sublayer: {} tokens, each attending to itself and the tokens before it", ids.len());
    println!("{:>8} {:<22} {:>8} {:>8}  first values after", "id", "token", "rms(x)", "rms(Δ)");
    for ((&id, x), y) in ids.iter().zip(before.chunks_exact(hidden)).zip(after.chunks_exact(hidden)) {
        let piece = commands::show_piece(tokenizer.token_bytes(id)?);
        let change: Vec<f32> = y.iter().zip(x).map(|(a, b)| a - b).collect();
        let first: Vec<String> = y[..4].iter().map(|v| format!("{v:>8.4}")).collect();
        println!("{id:>8} {piece:<22} {:>8.4} {:>8.4}  [{} ...]", rms(x), rms(&change), first.join(" "));
    }
    Ok(())
}
// ANCHOR_END: show_attention_update
