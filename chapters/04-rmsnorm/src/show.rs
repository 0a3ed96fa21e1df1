//! What the chapter prints about the values it computed: a few numbers of each token's row.

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
