//! `workload`: a preset, a Hugging Face `config.json`, or a transformer described inline.

use super::keys;
use super::reader::{self, Obj, Result, invalid};
use super::suggest::did_you_mean;
use crate::workload::{self, Workload};

pub(super) fn parse_workload(o: &Obj, load: &dyn Fn(&str) -> std::result::Result<String, String>) -> Result<Workload> {
    o.only(keys::WORKLOAD)?;
    let given = ["preset", "transformer", "hf_config"].iter().filter(|k| o.has(k)).count();
    if given != 1 {
        return Err(invalid(&o.path, "give exactly one of: preset, transformer, hf_config"));
    }
    if let Some(p) = o.string("preset")? {
        return workload::catalog::workload(p).ok_or_else(|| {
            invalid(
                &o.key("preset"),
                format!(
                    "\"{p}\" is not a workload preset{}; presets: {}",
                    did_you_mean(p, workload::catalog::names()),
                    workload::catalog::names().join(", ")
                ),
            )
        });
    }
    if let Some(path) = o.string("hf_config")? {
        let text = load(path).map_err(|e| invalid(&o.key("hf_config"), format!("cannot read \"{path}\": {e}")))?;
        let name = o.string("name")?.unwrap_or(path);
        if let Some(experts) = workload::hf::mixture_of_experts(&text) {
            return Err(reader::unsupported(
                &o.key("hf_config"),
                format!(
                    "\"{path}\" is a mixture-of-experts model ({experts}); experts (routing, all-to-all, \
                     expert parallelism) are not modelled yet, and simulating it as a dense model would be wrong"
                ),
            ));
        }
        return workload::hf::parse(name, &text).map_err(|e| invalid(&o.key("hf_config"), format!("\"{path}\": {e}")));
    }
    let t = o.req("transformer", Obj::obj)?;
    t.only(keys::TRANSFORMER)?;
    let layers = t.req("layers", Obj::uint)?;
    let hidden = t.req("hidden", Obj::uint)?;
    let heads = t.req("heads", Obj::uint)?;
    let vocab = t.req("vocab", Obj::uint)?;
    if hidden % heads != 0 && !t.has("head_dim") && !t.has("mla") {
        return Err(invalid(
            &t.key("heads"),
            format!("{heads} does not divide hidden {hidden}; allowed: a divisor of hidden"),
        ));
    }
    let mut cfg =
        workload::TransformerConfig::gpt(layers, hidden, heads, vocab, t.count("max_positions")?.unwrap_or(0));
    if let Some(f) = t.uint("ffn_hidden")? {
        cfg.ffn_hidden = f;
    }
    if let Some(kv) = t.uint("kv_heads")? {
        if heads % kv != 0 {
            return Err(invalid(
                &t.key("kv_heads"),
                format!("{kv} does not divide heads {heads}; allowed: a divisor of heads"),
            ));
        }
        cfg.kv_heads = kv;
    }
    use workload::transformer::{Mlp, Norm};
    if let Some(m) = t.choice("mlp", keys::MLP, |s| match s {
        "gelu" => Some(Mlp::Gelu),
        "swiglu" => Some(Mlp::SwiGlu),
        _ => None,
    })? {
        cfg.mlp = m;
    }
    if let Some(n) = t.choice("norm", keys::NORM, |s| match s {
        "layernorm" => Some(Norm::LayerNorm),
        "rmsnorm" => Some(Norm::RmsNorm),
        _ => None,
    })? {
        cfg.norm = n;
    }
    cfg.causal = t.boolean("causal")?.unwrap_or(true);
    cfg.bias = t.boolean("bias")?.unwrap_or(cfg.bias);
    cfg.dropout = t.boolean("dropout")?.unwrap_or(cfg.dropout);
    cfg.tied_embeddings = t.boolean("tied_embeddings")?.unwrap_or(cfg.tied_embeddings);
    cfg.rotary = t.boolean("rotary")?.unwrap_or(false);
    if let Some(d) = t.uint("head_dim")? {
        cfg.explicit_head_dim = Some(d);
    }
    if let Some(m) = t.obj("moe")? {
        m.only(keys::MOE)?;
        let experts = m.req("experts", Obj::uint)?;
        if experts < 2 {
            return Err(invalid(&m.key("experts"), format!("{experts}; allowed: 2 or more")));
        }
        let top_k = m.req("top_k", Obj::uint)?;
        if top_k > experts {
            return Err(invalid(&m.key("top_k"), format!("{top_k}; allowed: 1 to the {experts} experts")));
        }
        let dense_layers = m.count("dense_layers")?.unwrap_or(0);
        if dense_layers >= layers {
            return Err(invalid(
                &m.key("dense_layers"),
                format!("{dense_layers}; allowed: fewer than the {layers} layers (at least one MoE layer)"),
            ));
        }
        let capacity_factor = m.non_negative("capacity_factor")?.unwrap_or(0.0);
        if capacity_factor > 0.0 && capacity_factor * top_k as f64 > experts as f64 {
            return Err(invalid(
                &m.key("capacity_factor"),
                format!(
                    "{capacity_factor}: more rows per expert than tokens; allowed: 0 (dropless) or up to experts / top_k"
                ),
            ));
        }
        let imbalance = m.positive("imbalance")?.unwrap_or(1.0);
        if imbalance < 1.0 {
            return Err(invalid(
                &m.key("imbalance"),
                format!(
                    "{imbalance}; allowed: 1 (balanced routing) or more (the busiest expert-parallel rank's rows over the mean)"
                ),
            ));
        }
        if imbalance > 1.0 && capacity_factor > 0.0 {
            return Err(invalid(
                &m.key("imbalance"),
                format!(
                    "{imbalance} with a capacity factor: every expert is padded to its capacity, so ranks are not imbalanced; allowed: 1, or capacity_factor 0 (dropless)"
                ),
            ));
        }
        cfg.moe = Some(workload::moe::Moe {
            experts,
            top_k,
            expert_ffn: m.uint("expert_ffn")?.unwrap_or(cfg.ffn_hidden),
            shared_ffn: m.count("shared_ffn")?.unwrap_or(0),
            dense_layers,
            capacity_factor,
            imbalance,
        });
    }
    if let Some(m) = t.obj("mla")? {
        m.only(keys::MLA)?;
        cfg.mla = Some(workload::moe::Mla {
            q_lora_rank: m.count("q_lora_rank")?.unwrap_or(0),
            kv_lora_rank: m.req("kv_lora_rank", Obj::uint)?,
            qk_nope_head_dim: m.req("qk_nope_head_dim", Obj::uint)?,
            qk_rope_head_dim: m.count("qk_rope_head_dim")?.unwrap_or(0),
            v_head_dim: m.req("v_head_dim", Obj::uint)?,
        });
    }
    let name = o.string("name")?.unwrap_or("custom transformer");
    Ok(Workload::transformer(&format!("{name} ({layers} layers, h={hidden})"), cfg))
}
