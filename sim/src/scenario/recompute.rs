//! `plan.recompute_modules` and `plan.recompute_layers`: what a recomputation reruns, and on
//! how many layers. What is not modelled with them is refused here.

use super::reader::{self, Obj, Result, invalid};
use crate::plan::{PartitionPolicy, Recompute};

/// `recompute_modules`: a list of Megatron-Core's module names, each once, with
/// `"recompute": "selective"` only; `["core_attn"]` when absent.
pub(super) fn parse_recompute_modules(o: &Obj, recompute: Recompute) -> Result<crate::plan::RecomputeModules> {
    use crate::plan::RecomputeModules;
    let Some(v) = o.get("recompute_modules") else { return Ok(RecomputeModules::default()) };
    let key = o.key("recompute_modules");
    if recompute != Recompute::Selective {
        return Err(invalid(
            &key,
            "applies to selective recomputation only; set \"recompute\": \"selective\" or leave it out",
        ));
    }
    let names = super::reader::name_list(v, &key, &RecomputeModules::NAMES, "module")?;
    let modules = RecomputeModules::from_names(&names).map_err(|n| invalid(&key, format!("unknown module \"{n}\"")))?;
    if modules.contains("op_sac") && names.len() > 1 {
        return Err(invalid(
            &key,
            "\"op_sac\" (per-op selective checkpointing of the whole layer) cannot be combined with modules; give it alone",
        ));
    }
    Ok(modules)
}

/// `recompute_layers`: under `"recompute": "full"`, the number of each model chunk's layers
/// that recompute (its first ones, Megatron-LM's `--recompute-method block
/// --recompute-num-layers`); the others keep all their activations. PyTorch's per-block
/// checkpoint wrappers over part of the layers (torchtitan's `selective_ac_option` "2" wraps
/// every second block, fms-fsdp's `selective_checkpointing` a fraction of them) take the
/// same time and memory on one pipeline stage: the layers' order does not change either.
pub(super) fn parse_recompute_layers(
    o: &Obj,
    recompute: Recompute,
    layers: u32,
    token_slices: bool,
    partition_policy: Option<PartitionPolicy>,
) -> Result<Option<u32>> {
    let Some(n) = o.uint("recompute_layers")? else { return Ok(None) };
    let key = o.key("recompute_layers");
    if recompute != Recompute::Full {
        return Err(invalid(
            &key,
            "applies to full recomputation only (the layers that rerun whole); set \"recompute\": \"full\" or leave it out",
        ));
    }
    if n > layers {
        return Err(invalid(
            &key,
            format!("{n} is more than the workload's {layers} layers; allowed: 1 to {layers} (per model chunk)"),
        ));
    }
    let refuse = |why: &str| {
        Err(reader::unsupported(
            &key,
            format!("{why} assumes every layer recomputes the same; allowed: leave recompute_layers out"),
        ))
    };
    if token_slices {
        return refuse("token slicing's cost model (TeraPipe)");
    }
    if partition_policy.is_some() {
        return refuse("a computed partition (\"balanced\", \"parameters\", \"explore\")");
    }
    Ok(Some(n))
}
