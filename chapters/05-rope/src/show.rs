//! What the chapter prints about the values it computed: a few numbers of each token's row,
//! and how RoPE turned the queries.

use anyhow::Result;

use crate::config::Config;
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

// ANCHOR: show_rotation
/// Query head 0's first pair, (q[0], q[32]), for each position, before and after RoPE:
/// the pair turns by one radian per position (pair 0's frequency is 1) and keeps its length.
pub fn show_rotation(before: &[f32], after: &[f32], config: &Config) {
    let (q_dim, half) = (config.num_attention_heads * config.head_dim, config.head_dim / 2);
    println!();
    println!("query head 0, pair 0 (q[0], q[{half}]) by position: before RoPE -> after RoPE   |length|");
    for (position, (b, a)) in before.chunks_exact(q_dim).zip(after.chunks_exact(q_dim)).enumerate() {
        let length = |x: f32, y: f32| (x * x + y * y).sqrt();
        println!(
            "{position:>4}  ({:>8.4}, {:>8.4}) -> ({:>8.4}, {:>8.4})   {:.4} -> {:.4}",
            b[0],
            b[half],
            a[0],
            a[half],
            length(b[0], b[half]),
            length(a[0], a[half])
        );
    }
}
// ANCHOR_END: show_rotation
