//! Chapter 7: the first generated text.
//!
//! The library holds the chapter's code; `main.rs` is its command line. The MLP sublayer
//! completes the decoder layer; sixteen of them, the final norm and the LM head make the
//! whole model, and greedy generation picks the most likely next token again and again,
//! recomputing the whole sequence each time.

pub mod check;
pub mod checkpoint;
pub mod config;
pub mod generate;
pub mod gpu;
pub mod index;
pub mod model;
pub mod ops;
pub mod rope;
pub mod tokenizer;
pub mod weights;
