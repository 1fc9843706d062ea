//! scenario-fuzz: generated and mutated scenarios through every command of the trainsim
//! binary, each run classified (ok, clear error, panic, abort/signal, timeout, out of memory,
//! impossible numbers, unclear error). Exits non-zero if any run failed.
//!
//! `cargo run --release -p trainsim-fuzz -- --cases N --seed S [--jobs J] [--out DIR] [--bin PATH]`

mod bound;
mod case;
mod check;
mod exec;
mod generate;
mod invariants;
mod mutate;
mod presets;
mod rng;
mod shrink;
mod store;

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "Fuzz trainsim with generated and mutated scenarios through every command")]
struct Args {
    /// Number of cases (each runs simulate, train-run, partition, slices, and sometimes capacity
    /// and nccl-test on the scenario's node)
    #[arg(long, default_value_t = 300)]
    cases: u64,
    /// Seed: the same seed and case number always give the same input
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// First case number (to resume or shard a long run)
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Parallel runs; default: the available cores
    #[arg(long)]
    jobs: Option<usize>,
    /// Write each distinct failure (smallest input, command, output) here
    #[arg(long)]
    out: Option<PathBuf>,
    /// The trainsim binary; default: target/release/trainsim
    #[arg(long, default_value = "target/release/trainsim")]
    bin: PathBuf,
    /// CPU-time limit of one run (all threads), seconds; a run also stops at 10x this in
    /// wall-clock time (a hang that uses no CPU)
    #[arg(long, default_value_t = 20.0)]
    timeout: f64,
    /// CPU-time limit of one `capacity`, `partition` or `search` run (searches over many
    /// whole simulations), seconds
    #[arg(long, default_value_t = 600.0)]
    search_timeout: f64,
    /// Address-space limit of one run, MiB (ulimit -v); 0 = none
    #[arg(long, default_value_t = 8192)]
    mem_mib: u64,
    /// Fraction of cases that also run `capacity`
    #[arg(long, default_value_t = 0.03)]
    capacity_fraction: f64,
    /// Fraction of the cases of at most 32 devices that are a plan search instead (`search`
    /// on the scenario without its plan and micro-batch)
    #[arg(long, default_value_t = 0.05)]
    search_fraction: f64,
    /// Also run every scenario file (*.json with a workload) under these folders or files
    #[arg(long)]
    corpus: Vec<PathBuf>,
    /// After the run, shrink each distinct failure's input (at most this many runs each; 0 = off)
    #[arg(long, default_value_t = 0)]
    shrink: usize,
    /// Write the cases' inputs and commands under this folder (one folder per case) and run
    /// nothing: to reproduce a case from a long run's log
    #[arg(long)]
    dump: Option<PathBuf>,
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    // Runs start in their case's folder: the binary's path must not be relative.
    args.bin = match std::fs::canonicalize(&args.bin) {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "scenario-fuzz: {}: {e}\n(build it first: cargo build --release, or pass --bin)",
                args.bin.display()
            );
            return ExitCode::from(2);
        }
    };
    let cat = match presets::Catalog::load(&args.bin) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("scenario-fuzz: {e}\n(build it first: cargo build --release, or pass --bin)");
            return ExitCode::from(2);
        }
    };
    let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())).max(1);
    let limits = exec::Limits {
        timeout: Duration::from_secs_f64(args.timeout),
        search_timeout: Duration::from_secs_f64(args.search_timeout),
        mem_mib: args.mem_mib,
    };
    let mix = case::Mix { capacity_fraction: args.capacity_fraction, search_fraction: args.search_fraction };
    let tmp = std::env::temp_dir().join(format!("trainsim-fuzz-{}", std::process::id()));
    let mut store = store::Store { out: args.out.clone(), ..Default::default() };
    if let Some(out) = &args.out
        && let Err(e) = std::fs::create_dir_all(out)
    {
        eprintln!("scenario-fuzz: cannot create {}: {e}", out.display());
        return ExitCode::from(2);
    }
    eprintln!(
        "scenario-fuzz: {} cases from seed {} (cases {}..{}), {jobs} jobs, {} CPU s / {} MiB per run, binary {}",
        args.cases,
        args.seed,
        args.first,
        args.first + args.cases,
        args.timeout,
        args.mem_mib,
        args.bin.display()
    );
    let start = Instant::now();
    if let Some(dir) = &args.dump {
        return dump(dir, &args, &cat, mix);
    }
    let next = AtomicU64::new(args.first);
    let end = args.first + args.cases;
    let corpus: Vec<case::Case> = args.corpus.iter().flat_map(|d| case::corpus(d, u64::MAX / 2)).collect();
    let corpus: Vec<case::Case> =
        corpus.into_iter().enumerate().map(|(i, c)| case::Case { id: u64::MAX / 2 + i as u64, ..c }).collect();
    let total = args.cases + corpus.len() as u64;
    let next_corpus = AtomicU64::new(0);
    let (tx, rx) = mpsc::channel::<(case::Case, Vec<case::RunResult>)>();
    let mut kinds = std::collections::BTreeMap::<&str, u64>::new();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            let tx = tx.clone();
            let (next, cat, bin, tmp) = (&next, &cat, &args.bin, &tmp);
            let (next_corpus, corpus) = (&next_corpus, &corpus);
            s.spawn(move || {
                while let Some(c) = corpus.get(next_corpus.fetch_add(1, Ordering::Relaxed) as usize) {
                    let results = case::execute(c, bin, tmp, cat, limits);
                    if tx.send((c.clone(), results)).is_err() {
                        return;
                    }
                }
                loop {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= end {
                        break;
                    }
                    let c = case::build(args.seed, id, cat, mix);
                    let results = case::execute(&c, bin, tmp, cat, limits);
                    if tx.send((c, results)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut done = 0u64;
        let mut last_report = Instant::now();
        for (c, results) in rx {
            done += 1;
            *kinds.entry(c.kind).or_default() += 1;
            for r in &results {
                if let Some(sig) = store.add(&c, r) {
                    let what = if c.kind == "corpus" { c.tags.join(" ") } else { format!("case {}", c.id) };
                    eprintln!("  new: {sig}   ({what}, trainsim {})", r.args.join(" "));
                }
                if r.outcome.wall_s > 10.0 {
                    eprintln!("  slow: case {} {} took {:.1} s", c.id, r.args[0], r.outcome.wall_s);
                }
            }
            if done == total || last_report.elapsed() > Duration::from_secs(15) {
                last_report = Instant::now();
                eprintln!(
                    "[{done}/{total}] {} runs, {} failed, {} distinct; {:.0} s",
                    store.runs,
                    store.failures(),
                    store.signatures.len(),
                    start.elapsed().as_secs_f64()
                );
            }
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    if args.shrink > 0 {
        shrink_all(&mut store, &args, &cat, limits, &tmp, jobs);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let mut report = format!(
        "scenario-fuzz: seed {}, cases {}..{} ({}), {} runs in {elapsed:.0} s with {jobs} jobs\n\n",
        args.seed,
        args.first,
        end,
        kinds.join(", "),
        store.runs
    );
    report += &store.summary();
    if !store.signatures.is_empty() {
        report += "\ndistinct failures (runs, folder, signature):\n";
        report += &store.signature_list();
    }
    println!("{report}");
    if let Some(out) = &args.out {
        let _ = std::fs::write(out.join("summary.txt"), &report);
    }
    if store.failures() > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// Shrink every distinct failure but timeouts and out-of-memory ones (each attempt would run
/// to the limit), `jobs` at a time, and rewrite their examples.
fn shrink_all(
    store: &mut store::Store,
    args: &Args,
    cat: &presets::Catalog,
    limits: exec::Limits,
    tmp: &std::path::Path,
    jobs: usize,
) {
    use check::Class;
    let todo: Vec<(String, store::Example)> = store
        .signatures
        .iter()
        .filter(|(_, (_, e))| !matches!(e.class, Class::Timeout | Class::Oom))
        .map(|(s, (_, e))| (s.clone(), e.clone()))
        .collect();
    eprintln!("shrinking {} failures (at most {} runs each)...", todo.len(), args.shrink);
    let next = AtomicU64::new(0);
    let shrunk = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for j in 0..jobs {
            let (next, todo, shrunk) = (&next, &todo, &shrunk);
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some((sig, ex)) = todo.get(i) else { break };
                    let dir = tmp.join(format!("shrink-{j}"));
                    if let Some(text) = shrink::shrink(ex, sig, &args.bin, &dir, cat, limits, args.shrink) {
                        shrunk.lock().expect("no panics while held").push((sig.clone(), text));
                    }
                }
            });
        }
    });
    for (sig, text) in shrunk.into_inner().expect("no panics while held") {
        if let Some((_, ex)) = store.signatures.get_mut(&sig) {
            ex.text = text;
        }
        store.write(&sig);
    }
}

/// Writes cases `first..first+cases` as `DIR/case-N/` with their files and a `commands.txt`.
fn dump(dir: &std::path::Path, args: &Args, cat: &presets::Catalog, mix: case::Mix) -> ExitCode {
    for id in args.first..args.first + args.cases {
        let c = case::build(args.seed, id, cat, mix);
        let d = dir.join(format!("case-{id}"));
        let commands: String = c.runs.iter().map(|r| format!("trainsim {}\n", r.join(" "))).collect();
        let written = std::fs::create_dir_all(&d)
            .and_then(|()| case::write_input(&d, &c.text, &c.files))
            .and_then(|()| std::fs::write(d.join("commands.txt"), commands));
        if let Err(e) = written {
            eprintln!("scenario-fuzz: {}: {e}", d.display());
            return ExitCode::FAILURE;
        }
    }
    eprintln!("wrote {} cases under {}", args.cases, dir.display());
    ExitCode::SUCCESS
}
