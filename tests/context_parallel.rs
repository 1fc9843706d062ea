//! Context parallelism (`plan.cp`): each sequence split over `cp` replicas, keys and values
//! passed around a ring beside the attention kernel; its memory, FLOPs, communication and
//! refusals.

use crate::util::{no_files, scenario, simulate, with_intra_node_bandwidth};
use serde_json::{Value, json};

const LAYERS: u32 = 4;
const HIDDEN: u32 = 2048;
const SEQ: u32 = 16384;

/// One DGX A100 node: dp x cp = 8 replicas of a 4-layer GPT-style model at 16k tokens, fused
/// attention, one sample per replica's micro-batch, under Megatron-Core (Transformer Engine's
/// ring).
fn cp_scenario(dp: u32, cp: Option<u32>) -> Value {
    let training = json!({"global_batch": 8, "micro_batch": 1, "seq_len": SEQ, "precision": "bf16",
                          "attention": "flash", "framework": "megatron-core"});
    let mut plan = json!({"dp": dp, "tp": 1, "pp": 1});
    if let Some(cp) = cp {
        plan["cp"] = json!(cp);
    }
    let workload = json!({"transformer": {"layers": LAYERS, "hidden": HIDDEN, "heads": 16, "vocab": 32000}});
    serde_json::from_str(&scenario(workload, 1, training, plan)).unwrap()
}

fn report(v: &Value) -> Value {
    serde_json::to_value(simulate(&v.to_string())).unwrap()
}

fn refusal(v: &Value) -> String {
    match sim::scenario::parse(&v.to_string(), &no_files) {
        Ok(_) => panic!("accepted: {v}"),
        Err(e) => e.to_string(),
    }
}

/// `cp` 1 is the plan without context parallelism.
#[test]
fn cp_one_changes_nothing() {
    let (mut a, mut b) = (report(&cp_scenario(8, None)), report(&cp_scenario(8, Some(1))));
    for r in [&mut a, &mut b] {
        r.as_object_mut().unwrap().remove("defaults_applied");
    }
    assert_eq!(a, b);
    assert_eq!(a["plan"]["cp"], json!(1));
}

/// Eight devices on the same eight sequences, whole or split four ways: the model's FLOPs are
/// the same, the weights too (they are whole on every rank), and each device keeps a quarter
/// of the activations, since every op but attention runs on a quarter of the tokens of four
/// times as many micro-batches, of which one is in flight.
#[test]
fn context_parallelism_divides_activations_not_model_flops() {
    let (whole, split) = (report(&cp_scenario(8, None)), report(&cp_scenario(2, Some(4))));
    assert_eq!(split["plan"]["cp"], json!(4));
    assert_eq!(split["plan"]["micro_batches"], json!(4), "global_batch / dp sequences per replica");
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap();
    assert_eq!(f(&whole, "model_flops_per_iteration"), f(&split, "model_flops_per_iteration"));
    let mem = |r: &Value, k: &str| r["memory_breakdown"][k].as_f64().unwrap();
    assert_eq!(mem(&whole, "weights"), mem(&split, "weights"));
    let ratio = mem(&split, "activations") / mem(&whole, "activations");
    assert!((ratio - 0.25).abs() < 0.01, "activations {ratio} of the unsplit plan's");
    // The split attention runs as four smaller kernels: no faster than the whole one.
    let attn = |r: &Value| r["time_breakdown"][0]["attention_s"].as_f64().unwrap();
    assert!(attn(&split) >= attn(&whole), "attention {} s split vs {} s whole", attn(&split), attn(&whole));
}

/// The ring runs beside attention: on NVLink it hides behind the kernel; on a link 300 times
/// slower it cannot, and the report shows the excess as `exposed_cp_comm_s`, at least the
/// ring's time at the link's bandwidth less the attention it overlaps.
#[test]
fn the_ring_hides_behind_attention_until_the_link_is_slow() {
    let text = cp_scenario(1, Some(8)).to_string();
    let fast = serde_json::to_value(simulate(&text)).unwrap();
    let bw = 1e9;
    let slow = serde_json::to_value(simulate(&with_intra_node_bandwidth(&text, bw))).unwrap();
    let part = |r: &Value, k: &str| r["time_breakdown"][0][k].as_f64().unwrap();
    // The profile's ring is listed with the defaults (the scenario names Megatron-Core only).
    let listed = fast["defaults_applied"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d.as_str().is_some_and(|d| d.starts_with("training.framework.cp_ring = te_p2p (megatron-core")));
    assert!(listed, "{}", fast["defaults_applied"]);
    let attention = part(&fast, "attention_s");
    assert!(
        part(&fast, "exposed_cp_comm_s") < 0.01 * attention,
        "exposed {} s beside {attention} s of attention on NVLink",
        part(&fast, "exposed_cp_comm_s")
    );
    // Per layer and micro-batch: keys and values (2 x hidden wide, bf16) of 8 chunks of
    // SEQ / 8 tokens, all-gathered in forward, and again in backward with the gradients'
    // reduce-scatter: 3 rings, each sending 7/8 of the buffer over every device's port.
    let (cp, micro_batches) = (8.0, 8.0);
    let buffer = cp * 2.0 * (SEQ as f64 / cp) * 2.0 * HIDDEN as f64;
    let ring_s = 3.0 * LAYERS as f64 * micro_batches * (cp - 1.0) / cp * buffer / bw;
    let exposed = part(&slow, "exposed_cp_comm_s");
    let slow_attention = part(&slow, "attention_s");
    assert!(exposed >= ring_s - slow_attention, "exposed {exposed} s; ring {ring_s} s, attention {slow_attention} s");
    assert!(exposed <= 1.5 * ring_s, "exposed {exposed} s for a ring of {ring_s} s at the link's bandwidth");
    assert_eq!(part(&slow, "exposed_tp_comm_s"), 0.0, "tp = 1: the ring is not tensor-parallel traffic");
}

/// PyTorch's all-gather ring (`cp_ring` `pytorch_allgather`, the `pytorch-fsdp` and
/// `pytorch-ddp` profiles'): the all-gather of keys and values hides only behind the first
/// step (the rank's own keys, a cp-th of the work), so on a slow link more of it is exposed
/// than of Transformer Engine's ring: at least the two all-gathers (forward and backward)
/// less the local steps they run beside. Its fp32 merges add memory-bound work to attention.
#[test]
fn pytorchs_allgather_ring_hides_behind_the_first_step_only() {
    let te = cp_scenario(1, Some(8));
    let mut pt = te.clone();
    pt["training"]["framework"] = json!({"name": "megatron-core", "cp_ring": "pytorch_allgather"});
    let bw = 1e9;
    let run = |v: &Value, bw: Option<f64>| {
        let text = v.to_string();
        let text = bw.map_or(text.clone(), |bw| with_intra_node_bandwidth(&text, bw));
        serde_json::to_value(simulate(&text)).unwrap()
    };
    let part = |r: &Value, k: &str| r["time_breakdown"][0][k].as_f64().unwrap();
    let (te_fast, pt_fast) = (run(&te, None), run(&pt, None));
    assert!(part(&pt_fast, "attention_s") > part(&te_fast, "attention_s"), "fp32 merges add to attention");
    let (te_slow, pt_slow) = (run(&te, Some(bw)), run(&pt, Some(bw)));
    let (cp, micro_batches) = (8.0, 8.0);
    let buffer = cp * 2.0 * (SEQ as f64 / cp) * 2.0 * HIDDEN as f64;
    let gathers_s = 2.0 * LAYERS as f64 * micro_batches * (cp - 1.0) / cp * buffer / bw;
    // The local step: a cp-th of the kernels' work, at most twice its share of the time.
    let local_s = 2.0 * part(&pt_slow, "attention_s") / cp;
    let exposed = part(&pt_slow, "exposed_cp_comm_s");
    assert!(exposed >= gathers_s - local_s, "exposed {exposed} s; all-gathers {gathers_s} s, local steps {local_s} s");
    assert!(
        exposed > 1.2 * part(&te_slow, "exposed_cp_comm_s"),
        "PyTorch's ring {exposed} s exposed, Transformer Engine's {} s",
        part(&te_slow, "exposed_cp_comm_s")
    );
}

/// PyTorch's all-gather ring holds every rank's keys and values while its remote steps run
/// (Transformer Engine's holds a step's): with a vocabulary too small for the loss to set the
/// peak, the peak is higher by at least the gathered keys and values less the two chunks TE
/// double-buffers.
#[test]
fn pytorchs_ring_holds_the_gathered_keys_and_values() {
    let peak = |ring: &str| {
        let mut v = cp_scenario(1, Some(8));
        v["workload"]["transformer"]["vocab"] = json!(1000);
        v["training"]["framework"] = json!({"name": "megatron-core", "cp_ring": ring});
        report(&v)["peak_memory_bytes"].as_f64().unwrap()
    };
    // Keys and values of one 2,048-token chunk, bf16, 2 x hidden wide.
    let chunk = 2.0 * (SEQ as f64 / 8.0) * 2.0 * HIDDEN as f64;
    let (te, pt) = (peak("te_p2p"), peak("pytorch_allgather"));
    assert!(pt - te >= (8.0 - 2.0) * chunk, "peak {pt} B under PyTorch's ring, {te} B under Transformer Engine's");
}

/// PyTorch's ring refuses a non-causal model unless its load balancing is turned off: the
/// report says so, and says nothing of it for a causal model or for Transformer Engine's ring.
#[test]
fn a_non_causal_model_under_pytorchs_ring_is_noted() {
    let noted = |causal: bool, framework: &str| {
        let mut v = cp_scenario(2, Some(4));
        v["workload"]["transformer"]["causal"] = json!(causal);
        v["training"]["framework"] = json!(framework);
        let r = report(&v);
        r["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("balances load only under a causal mask"))
    };
    assert!(noted(false, "pytorch-fsdp"));
    assert!(!noted(true, "pytorch-fsdp"));
    assert!(!noted(false, "megatron-core"));
}

/// Frameworks without a context-parallel ring of their own say which ring `plan.cp` runs as.
#[test]
fn a_framework_without_a_ring_says_which_one_stands_in() {
    let notes = |framework: &str| {
        let mut v = cp_scenario(2, Some(4));
        v["training"]["framework"] = json!(framework);
        report(&v)["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    let stands_in = |n: &Vec<String>| n.iter().any(|n| n.contains("plan.cp runs as the ring") && n.contains("te_p2p"));
    assert!(stands_in(&notes("deepspeed")), "{:?}", notes("deepspeed"));
    assert!(stands_in(&notes("megatron-lm-2021")));
    assert!(!stands_in(&notes("megatron-core")));
}

#[test]
fn what_is_not_modelled_is_refused_with_the_reason() {
    let mut odd = cp_scenario(2, Some(4));
    odd["training"]["seq_len"] = json!(SEQ + 4);
    assert!(refusal(&odd).contains("2 x cp = 8 equal chunks"), "{}", refusal(&odd));
    let mut naive = cp_scenario(2, Some(4));
    naive["training"]["attention"] = json!("naive");
    assert!(refusal(&naive).contains("needs fused attention"), "{}", refusal(&naive));
    let mut grid = cp_scenario(1, Some(2));
    grid["plan"]["tp"] = json!(4);
    grid["plan"]["tp_mode"] = json!("2d");
    assert!(refusal(&grid).contains("not modelled with context parallelism"), "{}", refusal(&grid));
    let wrong = cp_scenario(8, Some(2));
    assert!(refusal(&wrong).contains("dp x cp x tp x pp = 8 x 2 x 1 x 1 = 16"), "{}", refusal(&wrong));
    let mut zero = cp_scenario(8, Some(1));
    zero["plan"]["cp"] = json!(0);
    assert!(refusal(&zero).contains("plan.cp"), "{}", refusal(&zero));
}

/// A whole run of a context-parallel plan: its iterations are the plan's simulated iteration
/// (train-run's epochs keep every device, each replica's context-parallel ranks included).
#[test]
fn a_whole_run_keeps_the_context_parallel_plan() {
    let mut v = cp_scenario(2, Some(4));
    v["run"] = json!({"tokens": 1e9});
    let dir = crate::util::TempDir::new("cp-run");
    let f = dir.write("run.json", &v.to_string());
    let o = crate::util::run_cli(&["train-run", f.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", crate::util::stderr(&o));
    let r: Value = serde_json::from_str(&crate::util::stdout(&o)).unwrap();
    let it = r["epochs"][0]["iteration_s"].as_f64().unwrap();
    assert_eq!(it, report(&cp_scenario(2, Some(4)))["iteration_s"].as_f64().unwrap());
}
