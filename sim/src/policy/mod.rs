//! Planning policies that choose how work is cut and scheduled before it is simulated:
//! [`token_slicing`] is TeraPipe's optimiser of token slices and sub-batches for one pipeline.

pub mod freeze;
pub mod gemini;
pub mod partition;
pub mod token_slicing;
