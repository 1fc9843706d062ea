//! `training`: batch, sequence length, precision, optimizer and attention kernels: what the
//! model trains with, whatever the parallel plan.

use super::keys;
use super::reader::{Obj, Result, invalid};
use crate::hardware::Precision;
use crate::plan::Optimizer;
use crate::workload::Workload;
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Training {
    /// Fused (FlashAttention) or materialised attention.
    pub flash_attention: bool,
    pub global_batch: u32,
    pub micro_batch: u32,
    pub seq_len: u32,
    pub precision: Precision,
    pub optimizer: Optimizer,
}

/// Attention kernels when the scenario does not say: see README ("What is modelled").
pub const DEFAULT_FLASH: bool = false;

pub(super) fn parse_training(o: &Obj, w: &Workload, defaults: &mut Vec<String>) -> Result<Training> {
    o.only(keys::TRAINING)?;
    let global_batch = o.req("global_batch", Obj::uint)?;
    let micro_batch = o.uint("micro_batch")?.unwrap_or_else(|| {
        defaults.push("training.micro_batch = 1".into());
        1
    });
    let mut seq_len = o.req("seq_len", Obj::uint)?;
    if let Some(fixed) = w.fixed_seq_len()
        && fixed != seq_len
    {
        let why =
            if w.net.is_some() { "tokens per sample of the workload" } else { "the workload's patches + class token" };
        defaults.push(format!("training.seq_len = {fixed} ({why}; {seq_len} was given)"));
        seq_len = fixed;
    }
    let precision = o.choice("precision", &Precision::NAMES, Precision::parse)?.unwrap_or_else(|| {
        defaults.push("training.precision = bf16".into());
        Precision::Bf16
    });
    let optimizer = o.choice("optimizer", &Optimizer::NAMES, Optimizer::parse)?.unwrap_or_else(|| {
        defaults.push("training.optimizer = adam".into());
        Optimizer::Adam
    });
    if micro_batch > global_batch {
        return Err(invalid(
            &o.key("micro_batch"),
            format!("{micro_batch} is larger than global_batch {global_batch}"),
        ));
    }
    let flash_attention = match o.choice("attention", keys::ATTENTION, |s| match s {
        "flash" => Some(true),
        "naive" => Some(false),
        _ => None,
    })? {
        Some(f) => f,
        None => {
            defaults.push(format!("training.attention = {}", if DEFAULT_FLASH { "flash" } else { "naive" }));
            DEFAULT_FLASH
        }
    };
    Ok(Training { flash_attention, global_batch, micro_batch, seq_len, precision, optimizer })
}
