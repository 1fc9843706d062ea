//! Built-in workloads. Architectures from the papers that define them (GPT-3: Brown et al.
//! 2020 Table 2.1; TeraPipe's 1B and 44B: SEEDS.md 2.5; GPT-2: Radford et al. 2019; Llama 2:
//! Touvron et al. 2023; Llama 3: Dubey et al. 2024 Table 3; BERT: Devlin et al. 2019; ViT:
//! Dosovitskiy et al. 2021 Table 1).

use super::Workload;
use super::moe::{Mla, Moe};
use super::transformer::{Input, TransformerConfig};

/// A preset with the size its authors published, for checking the parameter count.
pub struct Preset {
    pub name: &'static str,
    pub published_parameters: f64,
    /// For a mixture-of-experts model, the parameters one token uses, as published.
    pub published_active_parameters: Option<f64>,
    pub config: TransformerConfig,
}

/// A mixture-of-experts decoder (Llama-style: SwiGLU experts, RMSNorm, rotary positions).
#[allow(clippy::too_many_arguments)]
fn moe(
    (layers, hidden, heads, kv_heads, vocab): (u32, u32, u32, u32, u32),
    dense_ffn: u32,
    experts: u32,
    top_k: u32,
    expert_ffn: u32,
    shared_ffn: u32,
    dense_layers: u32,
) -> TransformerConfig {
    TransformerConfig {
        moe: Some(Moe { experts, top_k, expert_ffn, shared_ffn, dense_layers, capacity_factor: 0.0, imbalance: 1.0 }),
        ..TransformerConfig::llama(layers, hidden, heads, kv_heads, dense_ffn, vocab)
    }
}

/// Qwen3's MoE models: head width 128 at any model width.
fn qwen3_moe(layers: u32, hidden: u32, heads: u32, experts: u32, expert_ffn: u32) -> TransformerConfig {
    TransformerConfig {
        explicit_head_dim: Some(128),
        ..moe((layers, hidden, heads, 4, 151936), expert_ffn, experts, 8, expert_ffn, 0, 0)
    }
}

/// DeepSeek-V3 (arXiv 2412.19437 section 4.2; its config.json): 61 layers, the first 3 dense
/// (MLP 18432 wide), then 256 routed experts of 2048 and one shared, top-8; MLA with query
/// latent 1536, key/value latent 512, head widths 128 + 64 (rotary) for queries and keys and
/// 128 for values. The multi-token-prediction module (14B more) is not included.
fn deepseek_v3() -> TransformerConfig {
    TransformerConfig {
        mla: Some(Mla {
            q_lora_rank: 1536,
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
        }),
        ..moe((61, 7168, 128, 128, 129280), 18432, 256, 8, 2048, 2048, 3)
    }
}

fn gpt3(layers: u32, hidden: u32, heads: u32) -> TransformerConfig {
    TransformerConfig::gpt(layers, hidden, heads, 50257, 2048)
}

fn gpt2(layers: u32, hidden: u32, heads: u32) -> TransformerConfig {
    TransformerConfig::gpt(layers, hidden, heads, 50257, 1024)
}

fn bert(layers: u32, hidden: u32, heads: u32) -> TransformerConfig {
    TransformerConfig {
        causal: false,
        tied_embeddings: true,
        input: Input::Tokens { positions: 512, token_types: 2 },
        pooler: true,
        ..TransformerConfig::gpt(layers, hidden, heads, 30522, 512)
    }
}

fn vit(layers: u32, hidden: u32, heads: u32, ffn: u32, patch: u32) -> TransformerConfig {
    TransformerConfig {
        causal: false,
        ffn_hidden: ffn,
        input: Input::Patches { image: 224, patch, channels: 3, classes: 1000 },
        ..TransformerConfig::gpt(layers, hidden, heads, 0, 0)
    }
}

/// Every workload preset.
pub fn presets() -> Vec<Preset> {
    let p = |name, published_parameters, config| Preset {
        name,
        published_parameters,
        published_active_parameters: None,
        config,
    };
    let m = |name, total, active, config| Preset {
        name,
        published_parameters: total,
        published_active_parameters: Some(active),
        config,
    };
    vec![
        p("gpt3-125m", 125e6, gpt3(12, 768, 12)),
        // The GPT-3 paper rounds this size to 350M; the identical GPT-2 medium counts 355M.
        p("gpt3-350m", 355e6, gpt3(24, 1024, 16)),
        p("gpt3-760m", 760e6, gpt3(24, 1536, 16)),
        p("gpt3-1.3b", 1.3e9, gpt3(24, 2048, 24)),
        p("gpt3-2.7b", 2.7e9, gpt3(32, 2560, 32)),
        p("gpt3-6.7b", 6.7e9, gpt3(32, 4096, 32)),
        p("gpt3-13b", 13.0e9, gpt3(40, 5140, 40)),
        p("gpt3-175b", 175.0e9, gpt3(96, 12288, 96)),
        // TeraPipe's GPT3-1B and GPT3-44B (heads = H/128).
        p("gpt3-1b", 1.3e9, gpt3(24, 2048, 16)),
        p("gpt3-44b", 44.0e9, gpt3(96, 6144, 48)),
        p("gpt2", 124e6, gpt2(12, 768, 12)),
        p("gpt2-medium", 355e6, gpt2(24, 1024, 16)),
        p("gpt2-large", 774e6, gpt2(36, 1280, 20)),
        p("gpt2-xl", 1558e6, gpt2(48, 1600, 25)),
        p("llama2-7b", 6.74e9, TransformerConfig::llama(32, 4096, 32, 32, 11008, 32000)),
        p("llama2-13b", 13.02e9, TransformerConfig::llama(40, 5120, 40, 40, 13824, 32000)),
        p("llama2-70b", 68.98e9, TransformerConfig::llama(80, 8192, 64, 8, 28672, 32000)),
        p("llama3-8b", 8.03e9, TransformerConfig::llama(32, 4096, 32, 8, 14336, 128256)),
        p("llama3-70b", 70.55e9, TransformerConfig::llama(80, 8192, 64, 8, 28672, 128256)),
        p("llama3-405b", 405.8e9, TransformerConfig::llama(126, 16384, 128, 8, 53248, 128256)),
        p("bert-base", 110e6, bert(12, 768, 12)),
        p("bert-large", 340e6, bert(24, 1024, 16)),
        p("vit-b16", 86.6e6, vit(12, 768, 12, 3072, 16)),
        p("vit-l16", 304.3e6, vit(24, 1024, 16, 4096, 16)),
        p("vit-h14", 632e6, vit(32, 1280, 16, 5120, 14)),
        // Mixtral (Jiang et al. 2024, Table 1 and the model cards): 46.7B total, 12.9B active;
        // 8x22B: 141B and 39B.
        m("mixtral-8x7b", 46.7e9, 12.9e9, moe((32, 4096, 32, 8, 32000), 14336, 8, 2, 14336, 0, 0)),
        m("mixtral-8x22b", 141e9, 39e9, moe((56, 6144, 48, 8, 32768), 16384, 8, 2, 16384, 0, 0)),
        m("deepseek-v3", 671e9, 37e9, deepseek_v3()),
        // Qwen3 (arXiv 2505.09388, Table 2; config.json): 30.5B/3.3B and 235B/22B.
        m("qwen3-30b-a3b", 30.5e9, 3.3e9, qwen3_moe(48, 2048, 32, 128, 768)),
        m("qwen3-235b-a22b", 235e9, 22e9, qwen3_moe(94, 4096, 64, 128, 1536)),
    ]
}

/// Networks of distinct layers, with their published sizes where known (VGG-16: Simonyan &
/// Zisserman 2015; ResNet-50: He et al. 2016; GNMT's depends on details not modelled).
pub fn nets() -> Vec<(&'static str, Option<f64>, super::net::Net)> {
    use super::net;
    vec![
        ("vgg16", Some(138.36e6), net::vgg16(1000)),
        ("resnet50", Some(25.56e6), net::resnet50(1000)),
        ("gnmt-8", None, net::gnmt(8, 50)),
        ("gnmt-16", None, net::gnmt(16, 50)),
    ]
}

pub fn workload(name: &str) -> Option<Workload> {
    if let Some((n, _, net)) = nets().into_iter().find(|(n, _, _)| *n == name) {
        return Some(Workload::net(n, net));
    }
    presets().into_iter().find(|p| p.name == name).map(|p| Workload::transformer(p.name, p.config))
}

pub fn names() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = presets().iter().map(|p| p.name).collect();
    v.extend(nets().iter().map(|(n, _, _)| *n));
    v
}
