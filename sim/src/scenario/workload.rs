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
    if hidden % heads != 0 {
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
    let name = o.string("name")?.unwrap_or("custom transformer");
    Ok(Workload::transformer(&format!("{name} ({layers} layers, h={hidden})"), cfg))
}
