//! The binary's own preset catalog (`trainsim presets --json`): names to generate scenarios
//! from, and the facts the invariant checks need (device peaks, node sizes, model shapes).

use serde_json::Value;

#[derive(Clone, Debug)]
pub struct WorkloadInfo {
    pub name: String,
    pub layers: u32,
    /// Attention heads; 0 for networks of distinct layers (CNNs, GNMT).
    pub heads: u32,
    pub hidden: u64,
    pub ffn_hidden: u64,
    pub kv_heads: u32,
    /// Token input (a language model), as opposed to image patches or a CNN.
    pub tokens: bool,
    pub causal: bool,
    /// Routed experts of a mixture-of-experts model (0: dense).
    pub experts: u32,
}

impl WorkloadInfo {
    /// A network of distinct layers (no tensor parallelism, no freezing).
    pub fn is_net(&self) -> bool {
        self.heads == 0
    }
}

#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub name: String,
    pub devices: u32,
    pub device: Value,
}

#[derive(Clone, Debug, Default)]
pub struct Catalog {
    /// Device presets as the binary prints them (`peak_flops`, `hbm_bytes`, ...).
    pub devices: Vec<Value>,
    pub links: Vec<String>,
    pub nodes: Vec<NodeInfo>,
    pub workloads: Vec<WorkloadInfo>,
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

impl Catalog {
    pub fn from_json(v: &Value) -> Catalog {
        let list = |k: &str| v.get(k).and_then(Value::as_array).cloned().unwrap_or_default();
        let name = |x: &Value| x.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        let workloads = list("workloads")
            .iter()
            .map(|w| {
                let c = w.get("config").unwrap_or(&Value::Null);
                let heads = u(c, "heads") as u32;
                WorkloadInfo {
                    name: name(w),
                    layers: if heads > 0 { u(c, "layers") as u32 } else { u(w, "layers") as u32 },
                    heads,
                    hidden: u(c, "hidden"),
                    ffn_hidden: u(c, "ffn_hidden"),
                    kv_heads: u(c, "kv_heads") as u32,
                    tokens: c.pointer("/input/tokens").is_some(),
                    causal: c.get("causal").and_then(Value::as_bool).unwrap_or(false),
                    experts: c.pointer("/moe/experts").and_then(Value::as_u64).unwrap_or(0) as u32,
                }
            })
            .filter(|w| w.layers > 0)
            .collect();
        Catalog {
            devices: list("devices"),
            links: list("links").iter().map(name).collect(),
            nodes: list("nodes")
                .iter()
                .map(|n| NodeInfo {
                    name: name(n),
                    devices: u(n, "devices") as u32,
                    device: n.get("device").cloned().unwrap_or(Value::Null),
                })
                .collect(),
            workloads,
        }
    }

    /// Ask the binary for its catalog.
    pub fn load(bin: &std::path::Path) -> Result<Catalog, String> {
        let out = std::process::Command::new(bin)
            .args(["presets", "--json"])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        if !out.status.success() {
            return Err(format!("{} presets --json failed: {}", bin.display(), String::from_utf8_lossy(&out.stderr)));
        }
        let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("presets --json is not JSON: {e}"))?;
        let c = Catalog::from_json(&v);
        if c.devices.is_empty() || c.nodes.is_empty() || c.workloads.is_empty() || c.links.is_empty() {
            return Err("presets --json lists no devices, links, nodes or workloads".into());
        }
        Ok(c)
    }

    pub fn device(&self, name: &str) -> Option<&Value> {
        self.devices.iter().find(|d| d.get("name").and_then(Value::as_str) == Some(name))
    }
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.name == name)
    }
    pub fn workload(&self, name: &str) -> Option<&WorkloadInfo> {
        self.workloads.iter().find(|w| w.name == name)
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use serde_json::json;

    /// A catalog shaped like the binary's, for tests that do not run it.
    pub fn small_catalog() -> Catalog {
        let h100 = json!({"name": "h100-sxm", "kind": "gpu",
            "peak_flops": {"fp32": 6.69e13, "fp16": 9.894e14, "bf16": 9.894e14, "fp8": 1.9789e15}});
        let v100 = json!({"name": "v100-sxm2-16gb", "kind": "gpu",
            "peak_flops": {"fp32": 1.57e13, "fp16": 1.25e14, "bf16": null, "fp8": null}});
        Catalog::from_json(&json!({
            "devices": [h100, v100],
            "links": [{"name": "nvlink4"}, {"name": "ib-ndr"}],
            "nodes": [{"name": "dgx-h100", "devices": 8, "device": h100}, {"name": "dgx-1-v100", "devices": 8, "device": v100}],
            "workloads": [
                {"name": "gpt3-125m", "config": {"layers": 12, "heads": 12, "hidden": 768, "ffn_hidden": 3072,
                    "kv_heads": 12, "causal": true, "input": {"tokens": {"positions": 2048}}}},
                {"name": "vgg16", "layers": 16, "config": null}
            ]
        }))
    }

    #[test]
    fn catalog_reads_presets_json() {
        let c = small_catalog();
        assert_eq!(c.node("dgx-h100").map(|n| n.devices), Some(8));
        let g = c.workload("gpt3-125m").unwrap();
        assert_eq!((g.layers, g.heads, g.tokens, g.is_net()), (12, 12, true, false));
        assert!(c.workload("vgg16").unwrap().is_net());
    }
}
