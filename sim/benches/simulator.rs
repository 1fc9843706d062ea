//! Criterion benchmarks of the simulator's hot parts: a whole simulation of a small
//! pipeline, the lowering and the event engine of GPT-3 175B on 1024 GPUs (the case
//! `trainsim bench` times end to end), and TeraPipe's slicing optimiser.
//!
//! `cargo bench -p sim` (add `-- --quick` for a short run). Speed is measured here and by
//! `trainsim bench`, never asserted in tests.

use criterion::{Criterion, criterion_group, criterion_main};
use sim::policy::token_slicing::{SliceProblem, optimize};
use std::hint::black_box;

fn scenario(rel: &str) -> sim::scenario::Scenario {
    let path = format!("{}/../{rel}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    sim::scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn simulate_small_pipeline(c: &mut Criterion) {
    let s = scenario("experiments/parallelism/gpt3-6.7b-pp-1f1b.json");
    c.bench_function("simulate gpt3-6.7b 1f1b on 16 A100s", |b| {
        b.iter(|| black_box(sim::simulate(black_box(&s), false).report.iteration_s))
    });
}

fn gpt3_175b(c: &mut Criterion) {
    let s = scenario("experiments/core/gpt3-175b-1024xa100.json");
    let mut g = c.benchmark_group("gpt3-175b on 1024 A100s");
    g.sample_size(10);
    g.bench_function("lower", |b| b.iter(|| black_box(sim::lower::lower(black_box(&s)).tasks.len())));
    let program = sim::lower::lower(&s);
    let inputs = sim::engine_inputs(&s, &program, false);
    g.bench_function("engine", |b| b.iter(|| black_box(inputs.run(&program).expect("runs").iteration_ns)));
    g.finish();
}

/// The optimiser on TeraPipe's setting-5 shape (2048 tokens in 8-token units, 40 stages, a
/// batch of 32) with an analytical cost: a fixed part, linear in tokens, and attention
/// linear in tokens x context.
fn token_slicing(c: &mut Criterion) {
    let problem = SliceProblem::new(2048, 32, 40);
    let cost = |b: u32, l: u32, ctx: u32| {
        let (b, l, ctx) = (b as f64, l as f64, ctx as f64);
        1e-4 + 2e-6 * b * l + 1e-10 * b * l * (ctx + l)
    };
    let mut g = c.benchmark_group("token slicing");
    g.sample_size(10);
    g.bench_function("optimize 2048 tokens, 40 stages, batch 32", |b| {
        b.iter(|| black_box(optimize(black_box(&problem), &cost).expect("finite slice costs").latency_s))
    });
    g.finish();
}

criterion_group!(benches, simulate_small_pipeline, gpt3_175b, token_slicing);
criterion_main!(benches);
