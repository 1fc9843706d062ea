//! Per-kernel time variability (`simulation.kernel_jitter`): collectives wait for their
//! slowest member, in seeded draws.

use crate::util::{gpt3_175b, simulate};
use serde_json::{Value, json};

fn gpt3(jitter: Option<f64>, seed: Option<u64>) -> sim::report::Report {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(gpt3_175b()).unwrap()).unwrap();
    if let Some(j) = jitter {
        v["simulation"]["kernel_jitter"] = json!(j);
    }
    if let Some(s) = seed {
        v["simulation"]["seed"] = json!(s);
        v["simulation"]["kernel_jitter_draws"] = json!(true);
    }
    simulate(&v.to_string())
}

fn tp_wait(r: &sim::report::Report) -> f64 {
    r.time_breakdown[0].exposed_tp_comm_s
}

/// No jitter (`kernel_jitter` 0) is the model without waits, whatever the seed; with 3% per
/// kernel every tensor-parallel all-reduce waits for the slowest of the group's 8 ranks: the
/// iteration and its exposed TP time grow, and by less than a kernel's spread summed over its
/// stretch could (each wait is under about 3.5 standard deviations of the stretch before it).
/// The GPU default (1.47%, measured) is the same as given, and lies between.
#[test]
fn collectives_wait_for_their_slowest_member() {
    let plain = gpt3(Some(0.0), None);
    assert_eq!(gpt3(Some(0.0), Some(9)).iteration_s, plain.iteration_s);
    let default = gpt3(None, None);
    assert_eq!(default.iteration_s, gpt3(Some(0.0147), None).iteration_s);
    assert!(default.iteration_s > plain.iteration_s);
    let jittery = gpt3(Some(0.03), None);
    assert!(jittery.iteration_s > default.iteration_s);
    let added = jittery.iteration_s - plain.iteration_s;
    assert!(added > 0.0, "{} s vs {} s", jittery.iteration_s, plain.iteration_s);
    assert!(tp_wait(&jittery) > tp_wait(&plain));
    // Loose ceiling: every kernel 3.5 spreads late, the whole compute at most 3.5 x 3% slower.
    assert!(added < 3.5 * 0.03 * plain.iteration_s, "{added} s added to {} s", plain.iteration_s);
}

/// The same seed gives the same report; another seed another draw of about the same size.
#[test]
fn draws_are_seeded() {
    let (a, b) = (gpt3(Some(0.03), Some(1)), gpt3(Some(0.03), Some(1)));
    assert_eq!(serde_json::to_value(&a).unwrap(), serde_json::to_value(&b).unwrap());
    let c = gpt3(Some(0.03), Some(2));
    assert_ne!(a.iteration_s, c.iteration_s);
    assert!((a.iteration_s / c.iteration_s - 1.0).abs() < 0.01, "{} s vs {} s", a.iteration_s, c.iteration_s);
}

/// Without draws (the default) each collective waits the expected lateness of its slowest
/// member: the run is deterministic, about the mean of the drawn runs, and a folded simulation
/// (one replica and one tensor rank for all) waits exactly as the full one.
#[test]
fn expected_waits_are_deterministic_and_fold_exactly() {
    let expected = gpt3(Some(0.03), None);
    assert_eq!(expected.iteration_s, gpt3(Some(0.03), None).iteration_s);
    let drawn: f64 = (1..=3).map(|s| gpt3(Some(0.03), Some(s)).iteration_s).sum::<f64>() / 3.0;
    assert!((expected.iteration_s / drawn - 1.0).abs() < 0.01, "{} s against {drawn} s", expected.iteration_s);
    let path = crate::util::repo("experiments/parallelism/gpt3-6.7b-tp-1d.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["simulation"]["kernel_jitter"] = json!(0.03);
    let folded = simulate(&v.to_string());
    v["simulation"]["symmetry"] = json!(false);
    let full = simulate(&v.to_string());
    assert!(folded.events < full.events, "{} against {} events: nothing folded", folded.events, full.events);
    assert!(
        (folded.iteration_s / full.iteration_s - 1.0).abs() < 1e-3,
        "{} s against {} s",
        folded.iteration_s,
        full.iteration_s
    );
}
