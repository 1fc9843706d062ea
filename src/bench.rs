//! `trainsim bench`: how fast the simulator runs, on the headline GPT-3 175B scenario at
//! 1024, 3072 and 8192 GPUs. Prints one line per case, timing the whole simulation
//! (`sim::try_simulate`: lowering, the cost model, the engine, the report), then a line with
//! the same case's steps timed one by one, run again (`sim::lower_checked`,
//! `sim::engine_inputs`, the engine, `sim::finish`), with the engine's own events per second.
//! Last come the 1024-GPU case's engine alone, `engine_events_per_s=N engine_s=T lower_s=T`,
//! and its whole simulation, `events_per_s=N wall_s=T`.

use sim::scenario;
use std::time::Instant;

const GPT3: &str = include_str!("../experiments/core/gpt3-175b-1024xa100.json");

/// Global batch of the `--full` comparison: every device of the 1024-GPU case at the example's
/// 1,536 sequences is past the simulator's task limit (`lower::size::MAX_TASKS`), so both runs
/// of a pair take 48 micro-batches per replica.
const FULL_BATCH_PER_REPLICA: u32 = 48;

fn case(nodes: u32, dp: u32, symmetry: bool, full: bool) -> Result<scenario::Scenario, String> {
    let mut v: serde_json::Value = serde_json::from_str(GPT3).map_err(|e| e.to_string())?;
    v["cluster"]["nodes"] = nodes.into();
    v["plan"]["dp"] = dp.into();
    if full {
        v["training"]["global_batch"] = (FULL_BATCH_PER_REPLICA * dp).into();
    }
    v["simulation"] = serde_json::json!({"symmetry": symmetry});
    scenario::from_value(&v, &|_| Err("no files".into())).map_err(|e| e.to_string())
}

pub fn run(full: bool, quick: bool) -> Result<(), String> {
    let cases: &[(u32, u32)] = if quick { &[(128, 8)] } else { &[(128, 8), (384, 24), (1024, 64)] };
    let mut headline = None;
    for &(nodes, dp) in cases {
        let mut symmetric_iteration_s = None;
        for symmetry in if full { vec![true, false] } else { vec![true] } {
            let s = match case(nodes, dp, symmetry, full) {
                Ok(s) => s,
                // Every device of the largest cases is past the simulator's task limit.
                Err(e) if !symmetry => {
                    println!("gpt3-175b {:>5} GPUs [every device]: skipped: {e}", nodes * 8);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let start = Instant::now();
            let out = sim::try_simulate(&s, false).map_err(|e| {
                let every = if symmetry { "" } else { ", every device" };
                format!("bench case gpt3-175b on {} GPUs (dp={dp}{every}): {e}", s.cluster.device_count())
            })?;
            let wall_s = start.elapsed().as_secs_f64();
            let r = &out.report;
            println!(
                "gpt3-175b {:>5} GPUs (dp={} tp=8 pp=16, {} micro-batches){}: iteration_s={:.4} mfu={:.3} events={} tasks={} simulated_devices={} wall_s={:.3} events_per_s={:.0}",
                r.devices,
                dp,
                r.plan.micro_batches,
                if symmetry { "" } else { " [every device]" },
                r.iteration_s,
                r.mfu,
                r.events,
                r.tasks,
                r.simulated_devices,
                wall_s,
                r.events as f64 / wall_s
            );
            match symmetric_iteration_s {
                None => symmetric_iteration_s = Some(r.iteration_s),
                Some(it) if it != r.iteration_s => {
                    return Err(format!("symmetric and full simulations disagree: {it} s vs {} s", r.iteration_s));
                }
                Some(_) => {}
            }
            let steps = time_steps(&s, r)?;
            println!(
                "    steps: lower_s={:.3} inputs_s={:.3} engine_s={:.3} report_s={:.3} engine_events_per_s={:.0}",
                steps.lower_s,
                steps.inputs_s,
                steps.engine_s,
                steps.report_s,
                r.events as f64 / steps.engine_s
            );
            if nodes == 128 && headline.is_none() {
                headline = Some((r.events as f64 / wall_s, wall_s, r.events as f64 / steps.engine_s, steps));
            }
        }
    }
    let (eps, wall, engine_eps, steps) = headline.expect("the 1024-GPU case ran");
    println!("engine_events_per_s={engine_eps:.0} engine_s={:.3} lower_s={:.3}", steps.engine_s, steps.lower_s);
    println!("events_per_s={eps:.0} wall_s={wall:.3}");
    Ok(())
}

/// Seconds each step of one simulation took.
struct Steps {
    lower_s: f64,
    inputs_s: f64,
    engine_s: f64,
    report_s: f64,
}

/// Simulate `s` again step by step, timing each; the report must be `whole`'s (the case is a
/// plan that `try_simulate` simulates in exactly these steps).
fn time_steps(s: &scenario::Scenario, whole: &sim::report::Report) -> Result<Steps, String> {
    let t0 = Instant::now();
    let program = sim::lower_checked(s).map_err(|e| e.to_string())?;
    let t1 = Instant::now();
    let inputs = sim::engine_inputs(s, &program, false);
    let t2 = Instant::now();
    let result = inputs.run(&program).map_err(|e| e.to_string())?;
    let t3 = Instant::now();
    let out = sim::finish(s, program, result);
    let t4 = Instant::now();
    let r = &out.report;
    if (r.events, r.iteration_s) != (whole.events, whole.iteration_s) {
        return Err(format!(
            "the step-by-step simulation disagrees with the whole one: {} events, {} s vs {} events, {} s",
            r.events, r.iteration_s, whole.events, whole.iteration_s
        ));
    }
    let s = |a: Instant, b: Instant| (b - a).as_secs_f64();
    Ok(Steps { lower_s: s(t0, t1), inputs_s: s(t1, t2), engine_s: s(t2, t3), report_s: s(t3, t4) })
}
