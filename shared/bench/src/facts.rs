//! What the report's floors need to know about the model measured.

use crate::record::Part;

/// Notes, from a checkpoint's tensors (name, bytes), the bytes a decode step must read
/// (every weight once; an untied embedding table only for one row, which we neglect) and
/// the matrix work per prompt token of a prefill (two FLOPs per layer weight).
pub fn describe_model(tensors: &[(&str, usize)], tied: bool, layers: usize, q_width: usize, part: &mut Part) {
    let bytes = |name: &str| tensors.iter().filter(|(t, _)| t.contains(name)).map(|(_, b)| b).sum::<usize>();
    let all = bytes("");
    let table = bytes("embed_tokens");
    part.note("weight_bytes", all);
    part.note("decode_read_bytes", if tied { all } else { all - table });
    // Each bf16 weight of a layer is one multiply-add per token.
    part.note("layer_params", bytes("model.layers.") / 2);
    part.note("layers", layers);
    part.note("q_width", q_width);
}
