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
    /// Fused (a FlashAttention generation) or materialised attention, as written; `None`:
    /// the framework's ([`crate::plan::Plan::attention`] holds the one simulated).
    pub attention: Option<crate::hardware::kernels::Attention>,
    pub global_batch: u32,
    pub micro_batch: u32,
    pub seq_len: u32,
    pub precision: Precision,
    pub optimizer: Optimizer,
    /// Under 16-bit training, the optimizer keeps fp32 master weights and fp32 states (mixed
    /// precision, the default); `false`: no master copy, the states in the training precision
    /// (pure bf16 training: the model cast to bf16 before it is sharded, as KempnerForge does).
    pub master_weights: bool,
    /// `training.framework` as written (resolved against the plan in
    /// [`crate::plan::Plan::framework`]).
    #[serde(skip)]
    pub framework: Option<super::framework::FrameworkSpec>,
}

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
    let master_weights = o.boolean("master_weights")?.unwrap_or(true);
    // Absent: the framework's (resolved with the plan).
    let attention = o.choice("attention", keys::ATTENTION, crate::hardware::kernels::Attention::parse)?;
    let framework = super::framework::parse(o)?;
    Ok(Training { attention, global_batch, micro_batch, seq_len, precision, optimizer, master_weights, framework })
}
