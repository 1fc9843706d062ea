//! Today's hardware presets end to end: a Llama 3 8B step on each new node (B200, GB200 NVL72,
//! MI300X, and H200 NVL cards in a PCIe server) through `trainsim simulate`, to a finite,
//! plausible MFU; fp8 accepted where the device has fp8 tensor cores; an AMD device renamed in
//! a scenario still takes the generic collectives.

use crate::util::{TempDir, num, run, simulate_json, stderr, stdout};
use serde_json::{Value, json};

/// Llama 3 8B, 4k tokens, one micro-batch per replica per step, on `nodes` of `node`.
fn llama3_8b(node: Value, nodes: u32, precision: &str, plan: Value, global_batch: u32) -> Value {
    json!({
        "name": "llama3-8b on today's hardware",
        "workload": {"preset": "llama3-8b"},
        "cluster": {"node": node, "nodes": nodes},
        "training": {"global_batch": global_batch, "micro_batch": 1, "seq_len": 4096,
                     "precision": precision, "attention": "flash"},
        "plan": plan,
    })
}

fn simulate(tmp: &TempDir, name: &str, scenario: &Value) -> Value {
    simulate_json(&tmp.write(name, &scenario.to_string()))
}

/// (label, node, nodes, plan, global batch)
fn cases() -> Vec<(&'static str, Value, u32, Value, u32)> {
    let zero1 = |dp: u32, tp: u32| json!({"dp": dp, "tp": tp, "pp": 1, "zero_stage": 1});
    vec![
        ("hgx-b200", json!("hgx-b200"), 2, zero1(16, 1), 32),
        // One NVLink domain of 72 GPUs: tensor parallelism of 8 inside it, 9 replicas.
        ("gb200-nvl72", json!("gb200-nvl72"), 1, zero1(9, 8), 18),
        ("mi300x-8", json!("mi300x-8"), 2, zero1(16, 1), 32),
        // No published H200 NVL system has a single NVLink switch: eight cards on PCIe Gen5.
        (
            "h200-nvl",
            json!({"device": "h200-nvl", "devices": 8, "intra_node": "pcie5", "nics": 8, "nic": "ib-ndr",
                   "pcie": "pcie5"}),
            1,
            zero1(4, 2),
            8,
        ),
    ]
}

#[test]
fn each_new_preset_trains_llama3_8b_to_a_plausible_mfu() {
    let tmp = TempDir::new("hw-presets");
    let mut mfus = Vec::new();
    for (label, node, nodes, plan, gb) in cases() {
        for precision in ["bf16", "fp8"] {
            let r = simulate(
                &tmp,
                &format!("{label}-{precision}.json"),
                &llama3_8b(node.clone(), nodes, precision, plan.clone(), gb),
            );
            let (mfu, t) = (num(&r, "/mfu"), num(&r, "/iteration_s"));
            assert!(t.is_finite() && t > 0.0, "{label} {precision}: iteration {t} s");
            assert!(mfu > 0.0 && mfu < 1.0, "{label} {precision}: mfu {mfu}");
            assert_eq!(r["fits"], json!(true), "{label} {precision}: does not fit");
            if precision == "bf16" {
                // bf16 training of an 8B model lands in the range training reports publish.
                assert!(mfu > 0.15 && mfu < 0.75, "{label}: bf16 mfu {mfu}");
                mfus.push((label, mfu, t));
            }
        }
    }
    println!("{mfus:?}");
}

/// Same plan, same model: B200 runs a step faster than H100, GB200 (2.5 PFLOP/s) no slower
/// than B200 (2.25).
#[test]
fn blackwell_steps_are_faster_than_hopper_steps() {
    let tmp = TempDir::new("hw-blackwell");
    let plan = json!({"dp": 8, "tp": 1, "pp": 1, "zero_stage": 1});
    let step = |node: Value| {
        let r = simulate(&tmp, "s.json", &llama3_8b(node, 1, "bf16", plan.clone(), 16));
        num(&r, "/iteration_s")
    };
    let h100 = step(json!("dgx-h100"));
    let b200 = step(json!("hgx-b200"));
    let gb200 = step(json!({"preset": "gb200-nvl72", "devices": 8, "nics": 8}));
    assert!(b200 < 0.8 * h100, "b200 {b200} s vs h100 {h100} s");
    assert!(gb200 <= b200 * 1.01, "gb200 {gb200} s vs b200 {b200} s");
}

/// An MI300X is an AMD GPU whatever the scenario calls it: a renamed copy keeps its vendor
/// (no NCCL model), and a custom device can say it is AMD's.
#[test]
fn an_amd_device_keeps_its_vendor_when_renamed() {
    let renamed = json!({"preset": "mi300x-8", "device": {"preset": "mi300x", "name": "our accelerator"}});
    let s =
        sim::scenario::parse(&llama3_8b(renamed, 1, "bf16", json!({"dp": 8}), 8).to_string(), &crate::util::no_files)
            .expect("parses");
    assert_eq!(s.cluster.node.device.vendor, sim::hardware::Vendor::Amd);
    assert!(sim::hardware::Topology::new(&s.cluster).nccl().is_none());
    let custom = json!({"preset": "dgx-h100", "device": {"preset": "h100-sxm", "vendor": "amd"}});
    let s =
        sim::scenario::parse(&llama3_8b(custom, 1, "bf16", json!({"dp": 8}), 8).to_string(), &crate::util::no_files)
            .expect("parses");
    assert!(sim::hardware::Topology::new(&s.cluster).nccl().is_none());
    let bad = json!({"preset": "dgx-h100", "device": {"preset": "h100-sxm", "vendor": "amdd"}});
    let err = sim::scenario::parse(&llama3_8b(bad, 1, "bf16", json!({"dp": 8}), 8).to_string(), &crate::util::no_files)
        .expect_err("unknown vendor");
    assert!(err.to_string().contains("vendor") && err.to_string().contains("amd"), "{err}");
}

/// `trainsim presets` lists the new presets, the mesh marked.
#[test]
fn presets_lists_the_new_hardware() {
    let o = run(&[&"presets"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for name in ["b200", "gb200", "h200-nvl", "mi300x", "nvlink5", "xgmi-mi300x", "hgx-b200", "gb200-nvl72"] {
        assert!(text.contains(name), "{name} not listed");
    }
    assert!(text.contains("8 x mi300x on xgmi-mi300x (mesh)"), "{text}");
    assert!(text.contains("72 x gb200 on nvlink5"), "{text}");
}
