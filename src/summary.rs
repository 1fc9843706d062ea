//! What the CLI prints for people: the simulation's summary and the preset catalog.

fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / 1024f64.powi(3))
}

pub fn print_summary(r: &sim::report::Report) {
    let p = &r.plan;
    println!("{}", r.name);
    println!("workload:     {} ({:.3} B parameters)", r.workload, r.parameters / 1e9);
    println!("cluster:      {} ({} x {})", r.cluster, r.devices, r.device);
    println!(
        "plan:         dp={}{}{} tp={} pp={} {}{} micro-batches={}x{} recompute={:?}{}{} zero={}{}",
        p.dp,
        if p.cp > 1 { format!(" cp={}", p.cp) } else { String::new() },
        if p.ep > 1 { format!(" ep={}", p.ep) } else { String::new() },
        p.tp,
        p.pp,
        p.schedule,
        if p.virtual_stages > 1 { format!(" (v={})", p.virtual_stages) } else { String::new() },
        p.micro_batches,
        p.micro_batch,
        p.recompute,
        p.recompute_modules.map_or(String::new(), |m| format!("({})", m.names().join(","))),
        p.recompute_layers.map_or(String::new(), |n| format!(" ({n} layers per chunk)")),
        p.zero_stage,
        p.dp_shard.map_or(String::new(), |s| format!(" (sharded over {s} replicas, hybrid)"))
    );
    println!("iteration:    {:.4} s", r.iteration_s);
    println!(
        "throughput:   {:.2} samples/s, {} tokens/s ({} tokens/s per device)",
        r.samples_per_s,
        rate(r.tokens_per_s),
        rate(r.tokens_per_s_per_device)
    );
    println!(
        "MFU:          {:.1}% ({:.1} TFLOP/s of model math per device); HFU {:.1}% ({:.1} TFLOP/s with recomputation)",
        r.mfu * 100.0,
        r.model_flops_per_s_per_device / 1e12,
        r.hfu * 100.0,
        r.hardware_flops_per_s_per_device / 1e12
    );
    if (r.network_flops_per_iteration - r.model_flops_per_iteration).abs() > 0.1 * r.model_flops_per_iteration {
        println!(
            "              (the network runs {:.2} PFLOP per iteration: {:.1}% of peak; MFU counts 6 x parameters per sample)",
            r.network_flops_per_iteration / 1e15,
            r.network_flops_utilization * 100.0
        );
    }
    println!("bubble:       {:.1}% of the iteration", r.bubble_fraction * 100.0);
    if let Some(ts) = &r.token_slicing {
        println!(
            "token slices: {:.4} s without slicing (whole sequences), speedup {:.2}x",
            ts.iteration_s_without, ts.speedup
        );
        // Identical sub-batches are listed once with their count.
        let mut groups: Vec<(usize, &(u32, Vec<u32>))> = Vec::new();
        for sb in &ts.slices {
            match groups.last_mut() {
                Some((n, last)) if *last == sb => *n += 1,
                _ => groups.push((1, sb)),
            }
        }
        for (n, (sequences, slices)) in groups {
            println!("              {n} x {sequences} sequence(s) cut into {} slices: {slices:?}", slices.len());
        }
    }
    let m = &r.memory_breakdown;
    println!(
        "memory:       peak {} of {} on device {} -> {}",
        gib(r.peak_memory_bytes),
        gib(r.memory_capacity_bytes),
        r.peak_memory_device,
        if r.fits { "fits" } else { "DOES NOT FIT" }
    );
    println!(
        "              weights {}, gradients {}, optimizer {}, activations {}, buffers {}{}",
        gib(m.weights),
        gib(m.gradients),
        gib(m.optimizer),
        gib(m.activations),
        gib(m.buffers),
        if r.nccl_buffer_bytes > 0.0 { format!(" (NCCL's {})", gib(r.nccl_buffer_bytes)) } else { String::new() }
    );
    if !r.peak_activations.is_empty() {
        let mbs: std::collections::BTreeSet<u32> = r.peak_activations.iter().filter_map(|a| a.micro_batch).collect();
        let layers: std::collections::BTreeSet<i32> =
            r.peak_activations.iter().map(|a| a.layer).filter(|&l| l >= 0).collect();
        let largest = r.peak_activations.iter().max_by(|a, b| a.bytes.total_cmp(&b.bytes));
        let whose = match largest.map_or(0, |a| a.layer) {
            -1 => "the embedding".to_string(),
            -2 => "the output layer and loss".to_string(),
            -3 => "the optimizer step".to_string(),
            l => format!("layer {l}"),
        };
        let mb = largest.and_then(|a| a.micro_batch).map_or(String::new(), |m| format!(", micro-batch {m}"));
        println!(
            "              at the peak: activations of {} micro-batches over {} layers (largest {} for {whose}{mb})",
            mbs.len(),
            layers.len(),
            gib(largest.map_or(0.0, |a| a.bytes)),
        );
        if let Some(o) = r.peak_activations_omitted {
            println!(
                "              (listed: the largest {}; {} more entries hold {})",
                r.peak_activations.len(),
                o.entries,
                gib(o.bytes)
            );
        }
    }
    println!("stages:       stage  layers  busy_s    bubble_s  peak");
    for st in &r.stages {
        println!(
            "              {:>5}  {:>6}  {:<8.4}  {:<8.4}  {}",
            st.stage,
            st.layers,
            st.compute_busy_s,
            st.bubble_s,
            gib(st.peak_memory_bytes)
        );
    }
    print_time_breakdown(r);
    for c in &r.chunk_placement {
        println!(
            "chunks:       stage {}: {} chunks of {:.1} M parameters; per iteration {} fetches, {} evictions, {} moved per device; optimizer {:.0}% on the device, {:.0}% on the CPU{}",
            c.stage,
            c.chunks,
            c.chunk_params as f64 / 1e6,
            c.fetches,
            c.evictions,
            gib(c.moved_bytes),
            100.0 * c.optimizer_on_device,
            100.0 * (1.0 - c.optimizer_on_device),
            if c.feasible { "" } else { " (INFEASIBLE: a unit's chunks do not fit beside its non-model memory)" }
        );
    }
    println!(
        "engine:       {} events, {} flows, {} tasks, {} of {} devices simulated{}",
        r.events,
        r.flows,
        r.tasks,
        r.simulated_devices,
        r.devices,
        if r.symmetric { " (data-parallel symmetry)" } else { "" }
    );
    for n in &r.notes {
        println!("note:         {n}");
    }
    if !r.defaults_applied.is_empty() {
        println!("defaults:     {}", r.defaults_applied.join("; "));
    }
}

/// Short column names of `DeviceTime::parts`, in order; the first six are compute.
const PART_COLUMNS: [&str; 15] = [
    "gemm", "attn", "mem-bd", "emb/hd", "recomp", "optim", "TP", "CP", "EP", "DP", "PP", "bubble", "host", "offload",
    "other",
];

/// Where the time goes: one row per device class (the critical device first), percentages of
/// the iteration, only the columns some row uses.
fn print_time_breakdown(r: &sim::report::Report) {
    let Some(critical) = r.time_breakdown.first() else { return };
    let it = r.iteration_s.max(f64::MIN_POSITIVE);
    let used: Vec<usize> =
        (0..PART_COLUMNS.len()).filter(|&i| r.time_breakdown.iter().any(|t| t.parts()[i].1 >= 5e-4 * it)).collect();
    // A bar between compute and the first idle column.
    let first_idle = used.iter().copied().find(|&i| i >= 6).filter(|_| used.first().is_some_and(|&i| i < 6));
    let bar = |i: usize| if Some(i) == first_idle { " |" } else { "" };
    println!(
        "time split:   % of the {:.4} s iteration per device: compute by kind | exposed communication and waits (parts under 0.05% not shown)",
        r.iteration_s
    );
    let mut header = format!("              {:<32}", "device");
    for &i in &used {
        header += &format!("{} {:>6}", bar(i), PART_COLUMNS[i]);
    }
    println!("{header}");
    let row = |label: String, values: &dyn Fn(usize) -> String| {
        // A long device name is cut to the column (its full name is in the cluster line).
        let label = if label.chars().count() > 32 {
            format!("{}…", label.chars().take(31).collect::<String>())
        } else {
            label
        };
        let mut line = format!("              {label:<32}");
        for &i in &used {
            // A space before every value: a wide one (1234.567 ms) still stands apart.
            line += &format!("{} {:>6}", bar(i), values(i));
        }
        println!("{line}");
    };
    for t in &r.time_breakdown {
        let label = if t.role == "critical_device" {
            format!("critical: device {} (stage {})", t.device, t.stage)
        } else {
            format!("stage {}: {} x {}", t.stage, t.devices, t.device_name)
        };
        let parts = t.parts();
        row(label, &|i| format!("{:.1}", 100.0 * parts[i].1 / it));
    }
    let parts = critical.parts();
    let (unit, scale) = if r.iteration_s < 1.0 { ("ms", 1e3) } else { ("s", 1.0) };
    row(format!("critical, {unit}"), &|i| short(parts[i].1 * scale));
}

/// A non-negative number in at most six characters where it is under a million, with as many
/// decimals as fit (3 under 10, none from 1000).
fn short(v: f64) -> String {
    let decimals = if v < 10.0 {
        3
    } else if v < 100.0 {
        2
    } else if v < 1000.0 {
        1
    } else {
        0
    };
    format!("{v:.decimals$}")
}

pub fn presets(json: bool) {
    use sim::hardware::catalog;
    let devices = catalog::devices();
    let links = catalog::links();
    let nodes = catalog::nodes();
    let workloads = sim::workload::catalog::presets();
    let fabrics = sim::hardware::fabric::Fabric::presets();
    if json {
        let v = sim::presets_json();
        println!("{}", serde_json::to_string_pretty(&v).expect("serializable"));
        return;
    }
    println!("devices (dense peak at bf16/fp16, memory, bandwidth, rated board power):");
    for d in &devices {
        let peak = d.peak_flops.at(sim::hardware::Precision::Bf16).max(d.peak_flops.at(sim::hardware::Precision::Fp16));
        let power = d.power.map_or(String::new(), |p| format!("  {:>5.0} W", p.rated_w));
        println!(
            "  {:<16} {:>7.1} TFLOP/s  {:>8}  {:>6.0} GB/s  ({:?}){power}",
            d.name,
            peak / 1e12,
            gib(d.hbm_bytes),
            d.mem_bandwidth_bytes_per_s / 1e9,
            d.kind
        );
    }
    println!("links (per direction, latency, efficiency):");
    for l in &links {
        println!(
            "  {:<16} {:>7.2} GB/s  {:>5.1} us  {:.2}",
            l.name,
            l.bandwidth_bytes_per_s / 1e9,
            l.latency_s * 1e6,
            l.efficiency
        );
    }
    println!("nodes:");
    for n in &nodes {
        let mesh = if n.intra_topology == sim::hardware::IntraTopology::Mesh { " (mesh)" } else { "" };
        println!(
            "  {:<18} {} x {} on {}{mesh}, {} x {} to the fabric",
            n.name,
            n.devices,
            n.device.name,
            n.intra_node.as_ref().map_or("-", |l| l.name.as_str()),
            n.nics,
            n.nic.name
        );
    }
    println!("clusters: any node preset with \"nodes\": N, e.g. {{\"node\": \"dgx-a100-80gb\", \"nodes\": 128}}");
    println!("fabrics (cluster.fabric: pods of nodes at full bisection, the level above them):");
    for f in &fabrics {
        println!(
            "  {:<16} pods of {} nodes, 1:{} above them{}",
            f.name,
            f.pod_nodes,
            f.oversubscription,
            if f.rail_optimized { ", rail-optimised" } else { "" }
        );
    }
    println!("workloads (parameters):");
    for p in &workloads {
        match p.config.moe {
            Some(m) => println!(
                "  {:<14} {:>9.3} B  ({:.3} B active: {} of {} experts per token)",
                p.name,
                p.config.parameters() / 1e9,
                p.config.active_parameters() / 1e9,
                m.top_k,
                m.experts
            ),
            None => println!("  {:<14} {:>9.3} B", p.name, p.config.parameters() / 1e9),
        }
    }
    for (name, _, net) in sim::workload::catalog::nets() {
        println!("  {:<14} {:>9.3} B  ({} layers of their own)", name, net.parameters() / 1e9, net.layers.len());
    }
}

/// A rate for the summary: whole units from 100 up, three significant digits below (a slow
/// plan's fraction of a token per second is not printed as 0).
fn rate(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        let decimals = (2.0 - v.abs().log10().floor()).clamp(0.0, 12.0) as usize;
        format!("{v:.decimals$}")
    }
}

#[cfg(test)]
mod tests {
    use super::{rate, short};

    /// A slow plan's rate keeps three significant digits instead of printing as 0.
    #[test]
    fn a_small_rate_keeps_its_digits() {
        assert_eq!(rate(0.3231), "0.323");
        assert_eq!(rate(0.05392), "0.0539");
        assert_eq!(rate(96.73), "96.7");
        assert_eq!(rate(99_037.4), "99037");
        assert_eq!(rate(0.0), "0");
    }

    #[test]
    fn a_part_fits_its_column() {
        for v in [0.0, 1.088, 9.9994, 99.99, 370.518, 999.9, 1234.5, 99_999.0] {
            assert!(short(v).len() <= 6, "{v} as {}", short(v));
            assert!((short(v).parse::<f64>().unwrap() - v).abs() <= 0.5, "{v} as {}", short(v));
        }
    }
}
