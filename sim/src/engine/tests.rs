//! Analytical cross-checks of the engine: collectives against the alpha-beta formulas and
//! pipelines against the bubble formula, on hand-built programs.

use super::*;
use crate::hardware::{ClusterSpec, LinkSpec, Topology, catalog};
use crate::lower::{Collective, CollectiveKind, NONE, OpInstance, Program, Task, TaskKind, Transfer};
use crate::network::NetworkKind;
use crate::report::timeline::{Label, MemoryBreakdown, Phase, StreamKind};
use crate::schedule::{self, Pass, ScheduleKind, ScheduleShape};
use crate::workload::{OpClass, OpSpec, Saved};

fn link(bw: f64, lat: f64) -> LinkSpec {
    LinkSpec { name: "test".into(), bandwidth_bytes_per_s: bw, latency_s: lat, efficiency: 1.0, source: String::new() }
}

/// A cluster of FPGAs (no NCCL: collectives are the plain rings these tests check against the
/// alpha-beta formulas; NCCL's expansion is checked below and in `tests/nccl.rs`).
fn cluster(devices_per_node: u32, nodes: u32, intra: LinkSpec, nic: LinkSpec) -> ClusterSpec {
    let mut node = catalog::node_preset("dgx-a100-80gb").expect("preset");
    node.device = catalog::device("alveo-u280").expect("preset");
    node.devices = devices_per_node;
    node.intra_node = Some(intra);
    node.nic = nic;
    node.nics = devices_per_node;
    ClusterSpec::new(node, nodes)
}

fn empty_program(devices: u32) -> Program {
    Program {
        devices: (0..devices).collect(),
        stages: vec![0; devices as usize],
        mirror: (0..devices).collect(),
        streams: vec![Vec::new(); devices as usize * crate::lower::STREAMS],
        static_memory: vec![MemoryBreakdown::default(); devices as usize],
        labels: vec![Label { op: "x", layer: -1, phase: Phase::Forward, chunk: 0 }],
        ..Program::default()
    }
}

fn push(p: &mut Program, kind: TaskKind, payload: u32, streams: &[u32], mb: u32) -> u32 {
    let id = p.tasks.len() as u32;
    p.tasks.push(Task {
        kind,
        streams: streams.len() as u32,
        payload,
        label: 0,
        micro_batch: mb,
        memory: NONE,
        stream: streams[0],
    });
    for &s in streams {
        p.streams[s as usize].push(id);
    }
    id
}

fn opts() -> RunOptions {
    RunOptions {
        network: NetworkKind::MaxMinFair,
        record: false,
        collective_launch_ns: 0,
        kernel_jitter: 0.0,
        kernel_jitter_correlation_s: 0.0,
        kernel_jitter_draws: false,
        seed: 0,
    }
}

fn lone_collective(kind: CollectiveKind, per_node: u32, nodes: u32, bytes: f64, intra: LinkSpec, nic: LinkSpec) -> u64 {
    let c = cluster(per_node, nodes, intra, nic);
    let n = per_node * nodes;
    let mut p = empty_program(n);
    p.collectives.push(Collective::new(kind, (0..n).collect(), bytes));
    let streams: Vec<u32> = (0..n).map(|d| Program::stream_index(d, StreamKind::Compute)).collect();
    push(&mut p, TaskKind::Collective, 0, &streams, 0);
    run(&p, &Topology::new(&c), &[], &HostCosts::default(), opts()).expect("runs").iteration_ns
}

#[test]
fn lone_ring_all_reduce_matches_alpha_beta() {
    for p in [2u32, 3, 4, 8] {
        for (bytes, bw, alpha) in [(1e9, 100e9, 2e-6), (64e6, 25e9, 5e-6), (1e3, 300e9, 3e-6)] {
            let got = lone_collective(CollectiveKind::AllReduce, p, 1, bytes, link(bw, alpha), link(1e9, 0.0));
            let pf = p as f64;
            let expect = 2.0 * (pf - 1.0) / pf * bytes / bw + 2.0 * (pf - 1.0) * alpha;
            let steps = 2 * (p as u64 - 1);
            // Each step rounds its latency and its end up to the nanosecond.
            assert!((got as f64 - expect * 1e9).abs() <= 2.0 * steps as f64, "p={p} n={bytes}: {got} ns vs {expect} s");
        }
    }
}

#[test]
fn reduce_scatter_and_all_gather_are_half_an_all_reduce() {
    let (i, n) = (link(100e9, 1e-6), link(1e9, 0.0));
    let ar = lone_collective(CollectiveKind::AllReduce, 8, 1, 1e9, i.clone(), n.clone());
    let rs = lone_collective(CollectiveKind::ReduceScatter, 8, 1, 1e9, i.clone(), n.clone());
    let ag = lone_collective(CollectiveKind::AllGather, 8, 1, 1e9, i, n);
    assert_eq!(rs, ag);
    assert!((ar as i64 - 2 * rs as i64).abs() <= 16, "{ar} vs 2 x {rs}");
}

#[test]
fn hierarchical_all_reduce_sums_its_three_phases() {
    // 2 nodes x 4 devices: intra reduce-scatter (3 steps of n/4), inter all-reduce of n/4
    // over 2 nodes (2 steps of n/8) on each device's own NIC, intra all-gather (3 steps).
    let (bw_i, bw_n, a_i, a_n, n) = (200e9, 20e9, 2e-6, 5e-6, 1e9);
    let got = lone_collective(CollectiveKind::AllReduce, 4, 2, n, link(bw_i, a_i), link(bw_n, a_n));
    let expect = 2.0 * 3.0 * (n / 4.0 / bw_i + a_i) + 2.0 * (n / 8.0 / bw_n + a_n);
    assert!((got as f64 - expect * 1e9).abs() <= 16.0, "{got} ns vs {expect} s");
}

#[test]
fn concurrent_transfers_share_a_nic() {
    // Two devices of node 0 send to node 1 through one shared NIC: each at half rate.
    let mut c = cluster(2, 2, link(100e9, 0.0), link(10e9, 0.0));
    c.node.nics = 1;
    let mut p = empty_program(4);
    for (i, (s, t)) in [(0u32, 2u32), (1, 3)].into_iter().enumerate() {
        p.transfers.push(Transfer { source: s, target: t, bytes: 1e9 });
        push(&mut p, TaskKind::Transfer, i as u32, &[Program::stream_index(s, StreamKind::PipelineSend)], 0);
    }
    let r = run(&p, &Topology::new(&c), &[], &HostCosts::default(), opts()).expect("runs");
    assert_eq!(r.iteration_ns, 200_000_000);
    let mut ideal = opts();
    ideal.network = NetworkKind::Ideal;
    assert_eq!(run(&p, &Topology::new(&c), &[], &HostCosts::default(), ideal).expect("runs").iteration_ns, 100_000_000);
}

/// A pipeline built straight from a schedule table: each (stage, step) one compute task of
/// `f` or `b` ns (per chunk), free communication (plain dependencies).
fn pipeline(kind: ScheduleKind, shape: ScheduleShape, f: u64, b: u64) -> RunResult {
    let pp = shape.stages;
    let mut p = empty_program(pp);
    let v = shape.virtual_stages as u64;
    p.ops.push(device_op(false));
    p.ops.push(device_op(true));
    let op_ns = [f / v, b / v];
    let chunks = pp * shape.virtual_stages;
    let m = shape.micro_batches;
    let mut fwd = vec![NONE; (chunks * m) as usize];
    let mut bwd = vec![NONE; (chunks * m) as usize];
    for stage in 0..pp {
        let s = Program::stream_index(stage, StreamKind::Compute);
        for st in schedule::stage_order(kind, shape, stage).expect("valid") {
            let k = (st.chunk * m + st.micro_batch) as usize;
            let t = push(&mut p, TaskKind::Compute, (st.pass == Pass::Backward) as u32, &[s], st.micro_batch);
            if st.pass == Pass::Forward { fwd[k] = t } else { bwd[k] = t }
        }
        p.compute_marks.push(p.streams[s as usize].len() as u32);
    }
    for c in 0..chunks {
        for mb in 0..m {
            let k = (c * m + mb) as usize;
            if c + 1 < chunks {
                p.deps.push((fwd[k], fwd[k + m as usize]));
                p.deps.push((bwd[k + m as usize], bwd[k]));
            } else {
                p.deps.push((fwd[k], bwd[k]));
            }
        }
    }
    let c = cluster(pp, 1, link(1e12, 0.0), link(1e12, 0.0));
    run(&p, &Topology::new(&c), &op_ns, &HostCosts::default(), opts()).expect("runs")
}

/// `op()` as a device op instance of class 0 on all its compute units.
fn device_op(backward: bool) -> OpInstance {
    OpInstance {
        spec: op(),
        backward,
        on_host: false,
        nvme_bytes: 0.0,
        class: 0,
        sm_share: 1.0,
        part: crate::lower::OpPart::Whole,
        rows: 1.0,
        chunks: 1.0,
    }
}

fn op() -> OpSpec {
    OpSpec {
        name: "x",
        class: OpClass::Memory,
        forward_flops: 0.0,
        forward_bytes: 0.0,
        backward_flops: 0.0,
        backward_bytes: 0.0,
        saved: Saved::default(),
    }
}

fn bubble(r: &RunResult) -> f64 {
    let n = r.pipeline_end_ns.len();
    let end = *r.pipeline_end_ns.iter().max().expect("devices");
    (0..n).map(|d| (end - r.pipeline_busy_ns[d]) as f64).sum::<f64>() / n as f64 / r.iteration_ns as f64
}

#[test]
fn timeline_bubble_equals_the_analytical_formula() {
    for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
        for pp in 1..=8u32 {
            for m in [1u32, 2, 3, 8, 16, 32] {
                let shape = ScheduleShape { stages: pp, micro_batches: m, virtual_stages: 1 };
                // Backward twice the forward, as in a transformer.
                let r = pipeline(kind, shape, 1000, 2000);
                let expect = (pp as f64 - 1.0) / (m as f64 + pp as f64 - 1.0);
                assert!((bubble(&r) - expect).abs() < 1e-12, "{kind:?} p={pp} m={m}: {} vs {expect}", bubble(&r));
                assert_eq!(r.iteration_ns, (m + pp - 1) as u64 * 3000);
            }
        }
    }
}

#[test]
fn interleaved_bubble_shrinks_by_the_virtual_stages() {
    for pp in [2u32, 4] {
        for v in [2u32, 3] {
            for m in [pp, 2 * pp, 4 * pp] {
                let shape = ScheduleShape { stages: pp, micro_batches: m, virtual_stages: v };
                let r = pipeline(ScheduleKind::Interleaved, shape, 1200, 2400);
                let expect = schedule::bubble_fraction(ScheduleKind::Interleaved, shape);
                assert!((bubble(&r) - expect).abs() < 1e-9, "p={pp} v={v} m={m}: {} vs {expect}", bubble(&r));
            }
        }
    }
}

#[test]
fn runs_are_deterministic() {
    let shape = ScheduleShape { stages: 4, micro_batches: 8, virtual_stages: 1 };
    let a = pipeline(ScheduleKind::OneFOneB, shape, 700, 1300);
    let b = pipeline(ScheduleKind::OneFOneB, shape, 700, 1300);
    assert_eq!(a.iteration_ns, b.iteration_ns);
    assert_eq!(a.events, b.events);
    assert_eq!(a.pipeline_end_ns, b.pipeline_end_ns);
}

/// Device 0 runs `n` compute tasks of `gpu` ns each, issued by its host at `host` ns each;
/// with `recv`, the first waits for a transfer of `bytes` from device 1 (1 GB/s, no latency).
fn host_chain(n: u32, gpu: u64, host: u64, recv: Option<f64>) -> u64 {
    let c = cluster(2, 1, link(1e9, 0.0), link(1e9, 0.0));
    let mut p = empty_program(2);
    p.ops.push(device_op(false));
    let s = Program::stream_index(0, StreamKind::Compute);
    let tasks: Vec<u32> = (0..n).map(|_| push(&mut p, TaskKind::Compute, 0, &[s], 0)).collect();
    if let (Some(bytes), Some(&first)) = (recv, tasks.first()) {
        p.transfers.push(Transfer { source: 1, target: 0, bytes });
        let t = push(&mut p, TaskKind::Transfer, 0, &[Program::stream_index(1, StreamKind::PipelineSend)], 0);
        p.deps.push((t, first));
    }
    run(&p, &Topology::new(&c), &[gpu], &HostCosts { per_op: vec![host], per_collective: vec![host; 2] }, opts())
        .expect("runs")
        .iteration_ns
}

#[test]
fn short_kernels_run_at_the_hosts_pace() {
    // 100 kernels of 2 us issued at 10 us each: the host sets the pace (last ends 2 us after
    // its issue).
    assert_eq!(host_chain(100, 2_000, 10_000, None), 100 * 10_000 + 2_000);
    // Without a host cost the device alone sets it.
    assert_eq!(host_chain(100, 2_000, 0, None), 100 * 2_000);
}

#[test]
fn a_host_running_ahead_hides_its_cost_behind_long_kernels() {
    // 1 ms kernels: only the first issue is exposed.
    assert_eq!(host_chain(50, 1_000_000, 10_000, None), 10_000 + 50 * 1_000_000);
}

#[test]
fn the_host_waits_for_a_pipeline_receive() {
    // A 1 MB receive at 1 GB/s ends at 1 ms; only then does the host issue the 10 kernels
    // that depend on it, at 10 us each, while the device needs 2 us per kernel.
    let with = host_chain(10, 2_000, 10_000, Some(1e6));
    assert_eq!(with, 1_000_000 + 10 * 10_000 + 2_000);
    // Without the host model the kernels run back to back after the receive.
    assert_eq!(host_chain(10, 2_000, 0, Some(1e6)), 1_000_000 + 10 * 2_000);
}

/// A collective on two devices' compute streams starts when the slower of their hosts has
/// issued it: each device's own host cost (a GPU beside an FPGA without one).
#[test]
fn a_collective_waits_for_each_member_s_own_host() {
    let c = cluster(2, 1, link(1e9, 0.0), link(1e9, 0.0));
    let run_with = |per_collective: Vec<u64>| {
        let mut p = empty_program(2);
        p.ops.push(device_op(false));
        p.collectives.push(Collective::new(CollectiveKind::AllReduce, vec![0, 1], 1e3));
        let streams: Vec<u32> = (0..2).map(|d| Program::stream_index(d, StreamKind::Compute)).collect();
        push(&mut p, TaskKind::Collective, 0, &streams, 0);
        run(&p, &Topology::new(&c), &[0], &HostCosts { per_op: vec![0], per_collective }, opts())
            .expect("runs")
            .iteration_ns
    };
    let free = run_with(vec![0, 0]);
    assert_eq!(run_with(vec![0, 50_000]), free + 50_000);
    assert_eq!(run_with(vec![50_000, 20_000]), free + 50_000);
}

/// Consecutive ring steps over the same pairs run as one flow per pair: an 8-way all-reduce
/// in a node is 8 flows, not 14 steps x 8; a hierarchical one keeps its three phases
/// (4 + 4 + 4 flows on 2 nodes x 2 devices: intra, inter, intra).
#[test]
fn repeated_ring_steps_run_as_one_flow_per_pair() {
    let flows = |per_node: u32, nodes: u32| {
        let c = cluster(per_node, nodes, link(100e9, 1e-6), link(10e9, 5e-6));
        let n = per_node * nodes;
        let mut p = empty_program(n);
        p.collectives.push(Collective::new(CollectiveKind::AllReduce, (0..n).collect(), 1e8));
        let streams: Vec<u32> = (0..n).map(|d| Program::stream_index(d, StreamKind::Compute)).collect();
        push(&mut p, TaskKind::Collective, 0, &streams, 0);
        run(&p, &Topology::new(&c), &[], &HostCosts::default(), opts()).expect("runs").flows
    };
    assert_eq!(flows(8, 1), 8);
    assert_eq!(flows(2, 2), 12);
}

/// Two ops in a row, each a bit over half the clock's range: the run stops with an error
/// instead of wrapping the time; one of them alone fits.
#[test]
fn a_run_past_the_clock_is_an_error_not_a_wrapped_time() {
    let c = cluster(1, 1, link(1e12, 0.0), link(1e12, 0.0));
    let half = MAX_TIME_NS / 2 + 1;
    for (ops, want) in [(1usize, Ok(half)), (2, Err(RunError::TimeOverflow))] {
        let mut p = empty_program(1);
        p.ops.push(device_op(false));
        let s = Program::stream_index(0, StreamKind::Compute);
        for _ in 0..ops {
            push(&mut p, TaskKind::Compute, 0, &[s], 0);
        }
        let r = run(&p, &Topology::new(&c), &[half], &HostCosts::default(), opts()).map(|r| r.iteration_ns);
        assert_eq!(r, want, "{ops} ops of {half} ns");
    }
    // A transfer over a link too slow for the clock saturates into the same error.
    let slow = cluster(2, 1, link(1e-12, 0.0), link(1e-12, 0.0));
    let mut p = empty_program(2);
    p.transfers.push(Transfer { source: 0, target: 1, bytes: 1e9 });
    push(&mut p, TaskKind::Transfer, 0, &[Program::stream_index(0, StreamKind::Compute)], 0);
    assert_eq!(run(&p, &Topology::new(&slow), &[], &HostCosts::default(), opts()).err(), Some(RunError::TimeOverflow));
}

/// A collective over 256, 300 and 512 members (more than a u8 counts) completes, and takes
/// longer with more members on the same links (a ring all-reduce's latency term grows).
#[test]
fn collectives_over_256_members_complete_and_grow_with_members() {
    let times: Vec<u64> = [248u32, 256, 264, 512]
        .iter()
        .map(|&n| lone_collective(CollectiveKind::AllReduce, 8, n / 8, 1e6, link(1e11, 1e-6), link(1e10, 5e-6)))
        .collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
}

fn nccl_program(n: u32, collectives: &[(CollectiveKind, f64, StreamKind)]) -> Program {
    let mut p = empty_program(n);
    for (i, &(kind, bytes, stream)) in collectives.iter().enumerate() {
        p.collectives.push(Collective::new(kind, (0..n).collect(), bytes));
        let streams: Vec<u32> = (0..n).map(|d| Program::stream_index(d, stream)).collect();
        push(&mut p, TaskKind::Collective, i as u32, &streams, 0);
    }
    p
}

/// On GPUs a collective alone takes what NCCL's model says of its plan: the flows, their
/// ceilings and the wire bytes reproduce latency + link bytes / bus bandwidth.
#[test]
fn a_lone_nccl_collective_takes_its_plans_time() {
    for (node, nodes) in [("dgx-a100-80gb", 1u32), ("dgx-h100", 1), ("dgx-a100-80gb", 2)] {
        let c = ClusterSpec::new(catalog::node_preset(node).expect("preset"), nodes);
        let topo = Topology::new(&c);
        let n = 8 * nodes;
        for kind in [
            CollectiveKind::AllReduce,
            CollectiveKind::AllGather,
            CollectiveKind::ReduceScatter,
            CollectiveKind::AllToAll,
        ] {
            for bytes in [8.0, 4096.0, 1e6, 3e7, 1e9] {
                let p = nccl_program(n, &[(kind, bytes, StreamKind::Compute)]);
                let plan = collective::nccl_plan(&p.collectives[0], &topo).expect("GPU cluster");
                let got = run(&p, &topo, &[], &HostCosts::default(), opts()).expect("runs").iteration_ns as f64;
                let want = plan.time_s(bytes) * 1e9;
                assert!((got - want).abs() <= want * 1e-3 + 2.0, "{node} x{nodes} {kind:?} {bytes}: {got} vs {want}");
            }
        }
    }
}

/// Two large all-reduces at once over the same GPUs share their ports: together they take
/// about twice as long as one, not as long.
#[test]
fn concurrent_nccl_collectives_share_links() {
    let c = ClusterSpec::new(catalog::node_preset("dgx-a100-80gb").expect("preset"), 1);
    let topo = Topology::new(&c);
    let one = nccl_program(8, &[(CollectiveKind::AllReduce, 1e9, StreamKind::Compute)]);
    let two = nccl_program(
        8,
        &[
            (CollectiveKind::AllReduce, 1e9, StreamKind::Compute),
            (CollectiveKind::AllReduce, 1e9, StreamKind::DataParallel),
        ],
    );
    let t1 = run(&one, &topo, &[], &HostCosts::default(), opts()).expect("runs").iteration_ns as f64;
    let t2 = run(&two, &topo, &[], &HostCosts::default(), opts()).expect("runs").iteration_ns as f64;
    assert!(t2 > 1.95 * t1 && t2 < 2.05 * t1, "{t1} vs {t2}");
}

/// Where the time goes, by hand: stage 0 computes 100 us and sends 1 MB over a 10 GB/s link
/// (100 us) to stage 1, which computes 100 us; then both all-reduce 1 MB on their
/// data-parallel streams (100 us). Stage 1 waits 100 us for stage 0's compute (bubble), 100 us
/// for the transfer, 100 us for the all-reduce, then for stage 0, which after its kernel
/// copies 100 MB to the host: that copy ends last, so all its waits are charged to it.
#[test]
fn idle_time_is_charged_to_what_ended_it() {
    use crate::lower::HostCopy;
    use crate::report::breakdown::{PARTS, Part};
    let c = cluster(2, 1, link(10e9, 0.0), link(1e9, 0.0));
    let mut p = empty_program(2);
    // A bandwidth-bound op of layer 0.
    p.labels[0].layer = 0;
    p.ops.push(device_op(false));
    let op_ns = [100_000u64];
    let (c0, c1) = (Program::stream_index(0, StreamKind::Compute), Program::stream_index(1, StreamKind::Compute));
    let a = push(&mut p, TaskKind::Compute, 0, &[c0], 0);
    p.transfers.push(Transfer { source: 0, target: 1, bytes: 1e6 });
    let send = push(&mut p, TaskKind::Transfer, 0, &[Program::stream_index(0, StreamKind::PipelineSend)], 0);
    let b = push(&mut p, TaskKind::Compute, 0, &[c1], 0);
    p.deps.extend([(a, send), (send, b)]);
    p.host_copies.push(HostCopy { device: 0, to_device: false, bytes: 1e8, nvme: false });
    let copy = push(&mut p, TaskKind::HostCopy, 0, &[Program::stream_index(0, StreamKind::HostCopy)], 0);
    p.deps.push((a, copy));
    p.collectives.push(Collective::new(CollectiveKind::AllReduce, vec![0, 1], 1e6));
    let dp = [Program::stream_index(0, StreamKind::DataParallel), Program::stream_index(1, StreamKind::DataParallel)];
    let ar = push(&mut p, TaskKind::Collective, 0, &dp, 0);
    p.deps.push((b, ar));
    let r = run(&p, &Topology::new(&c), &op_ns, &HostCosts::default(), opts()).expect("runs");
    let us = 1_000u64;
    let end = r.iteration_ns;
    assert!(end > 400 * us, "the copy ends last: {end} ns");
    let mut stage1 = [0u64; PARTS];
    stage1[Part::Bubble as usize] = 100 * us;
    stage1[Part::PpComm as usize] = 100 * us;
    stage1[Part::MemoryBound as usize] = 100 * us;
    stage1[Part::DpComm as usize] = 100 * us;
    stage1[Part::Tail as usize] = end - 400 * us;
    assert_eq!(r.time_parts_ns[1], stage1);
    let mut stage0 = [0u64; PARTS];
    stage0[Part::MemoryBound as usize] = 100 * us;
    stage0[Part::Offload as usize] = end - 100 * us;
    assert_eq!(r.time_parts_ns[0], stage0);
}

/// On MI300X's Infinity Fabric mesh a transfer between two GPUs runs at one link's rate (not
/// its port's seven links), and an all-reduce over all eight reaches seven links' worth of bus
/// bandwidth, over two GPUs one link's: AMD measures 45-48 GB/s per link and 310-330 GB/s of
/// RCCL all-reduce bus bandwidth on 8 GPUs (the link preset's efficiency is read off that same
/// measurement, so this checks the mesh model's arithmetic, not a prediction).
#[test]
fn mi300x_mesh_transfers_take_one_link_and_collectives_all_of_them() {
    let c = ClusterSpec::new(catalog::node_preset("mi300x-8").expect("preset"), 1);
    let topo = Topology::new(&c);
    let xgmi = c.node.intra_node.clone().expect("xgmi");
    let link = xgmi.effective_bytes_per_s();
    let mut p = empty_program(8);
    p.transfers.push(Transfer { source: 0, target: 1, bytes: 1e9 });
    push(&mut p, TaskKind::Transfer, 0, &[Program::stream_index(0, StreamKind::PipelineSend)], 0);
    let r = run(&p, &topo, &[], &HostCosts::default(), opts()).expect("runs");
    let want = 1e9 / link + xgmi.latency_s;
    assert!((r.iteration_ns as f64 * 1e-9 / want - 1.0).abs() < 1e-6, "{} ns vs {want} s", r.iteration_ns);

    let busbw = |gpus: u32| {
        let one =
            lone::lone_collective(&c, CollectiveKind::AllReduce, gpus, (1u64 << 30) as f64, NetworkKind::MaxMinFair)
                .expect("runs");
        assert!(one.plan.is_none(), "no NCCL plan on an AMD GPU");
        one.busbw_bytes_per_s
    };
    let (eight, two) = (busbw(8), busbw(2));
    assert!((eight / (7.0 * link) - 1.0).abs() < 0.02, "{eight} vs 7 x {link}");
    assert!((300e9..340e9).contains(&eight), "{eight}");
    assert!((two / link - 1.0).abs() < 0.02, "{two} vs {link}");
}

/// An all-to-all of `bytes` per member over `members` of a cluster of `nodes` presets: its
/// expansion and, run alone on the members' compute streams, its time in seconds.
fn lone_all_to_all(
    node: &str,
    nodes: u32,
    nics: Option<u32>,
    members: &[u32],
    bytes: f64,
) -> (Topology, collective::Steps, f64) {
    let mut n = catalog::node_preset(node).expect("preset");
    if let Some(k) = nics {
        n.nics = k;
    }
    let c = ClusterSpec::new(n, nodes);
    let topo = Topology::new(&c);
    let mut p = empty_program(c.device_count());
    let col = Collective::new(CollectiveKind::AllToAll, members.to_vec(), bytes);
    let steps = collective::expand(&col, &topo);
    p.collectives.push(col);
    let streams: Vec<u32> = members.iter().map(|&d| Program::stream_index(d, StreamKind::Compute)).collect();
    push(&mut p, TaskKind::Collective, 0, &streams, 0);
    let t = run(&p, &topo, &[], &HostCosts::default(), opts()).expect("runs").iteration_ns as f64 * 1e-9;
    (topo, steps, t)
}

/// Bytes each link carries in a collective's steps.
fn link_loads(topo: &Topology, steps: &collective::Steps) -> Vec<f64> {
    let mut load = vec![0.0; topo.link_count()];
    for f in steps.iter().flat_map(|s| &s.flows) {
        for &l in topo.route(f.source, f.target).links() {
            load[l as usize] += f.bytes;
        }
    }
    load
}

/// Off NVIDIA GPUs (FPGAs: direct flows) and inside one NVSwitch node (NCCL's send/recv) each
/// member sends a block of n/p to each of its p - 1 peers and receives one from each: (p-1)/p
/// of its buffer leaves it and as much arrives, in one step.
#[test]
fn all_to_all_moves_p_minus_1_over_p_of_each_buffer_off_each_device() {
    let fpga = cluster(8, 1, link(100e9, 1e-6), link(10e9, 1e-6));
    let dgx = ClusterSpec::new(catalog::node_preset("dgx-a100-80gb").expect("preset"), 1);
    let bytes = 1e9;
    for (c, p) in [(&fpga, 8u32), (&fpga, 5), (&dgx, 8), (&dgx, 3)] {
        let topo = Topology::new(c);
        let col = Collective::new(CollectiveKind::AllToAll, (0..p).collect(), bytes);
        let steps = collective::expand(&col, &topo);
        assert_eq!(steps.len(), 1);
        let want = (p - 1) as f64 / p as f64 * bytes;
        for d in 0..p {
            let out: Vec<f64> = steps[0].flows.iter().filter(|f| f.source == d).map(|f| f.bytes).collect();
            let sent: f64 = out.iter().sum();
            let got: f64 = steps[0].flows.iter().filter(|f| f.target == d).map(|f| f.bytes).sum();
            assert_eq!(out.len(), p as usize - 1, "one flow per peer");
            assert!(
                (sent - want).abs() < 1e-9 * want && (got - want).abs() < 1e-9 * want,
                "p={p} dev {d}: {sent} {got}"
            );
        }
    }
}

/// Across nodes NCCL relays each block to its rail (PXN): with one NIC per GPU every NIC
/// carries (N-1)/N of a buffer each way, the GPUs' own blocks for other nodes' GPUs of its
/// index; every NVLink port (k-1)/k: a block for each node-mate, and one for each node-mate's
/// rail per other node. Inter-node flows only join GPUs of the same local index.
#[test]
fn all_to_all_across_nodes_keeps_each_rail_on_its_nic() {
    let (k, n, bytes) = (8u32, 4u32, 1e9);
    let members: Vec<u32> = (0..k * n).collect();
    let (topo, steps, _) = lone_all_to_all("dgx-h100", n, None, &members, bytes);
    let load = link_loads(&topo, &steps);
    let nic = (n - 1) as f64 / n as f64 * bytes;
    let port = (k - 1) as f64 / k as f64 * bytes;
    for node in 0..n {
        for i in 0..k {
            let out = topo.nic_out(node, i) as usize;
            assert!((load[out] - nic).abs() < 1e-6 * nic && (load[out + 1] - nic).abs() < 1e-6 * nic, "{node}/{i}");
            let d = (node * k + i) as usize;
            assert!((load[2 * d] - port).abs() < 1e-6 * port && (load[2 * d + 1] - port).abs() < 1e-6 * port);
        }
    }
    for f in &steps[0].flows {
        if topo.node_of(f.source) != topo.node_of(f.target) {
            assert_eq!(f.source % k, f.target % k, "{f:?} leaves its rail");
        }
    }
}

/// Inside one NVSwitch node the exchange is bound by each GPU's port: (p-1)/p of the buffer
/// at the port's effective rate, within NCCL's latency, for large buffers; small ones pay the
/// latency and few channels.
#[test]
fn all_to_all_inside_an_nvswitch_node_approaches_the_port_bandwidth() {
    for (node, p) in [("dgx-a100-80gb", 8u32), ("dgx-h100", 8), ("dgx-h100", 4), ("dgx-a100-80gb", 2)] {
        let port = catalog::node_preset(node).expect("preset").intra_node.expect("nvlink").effective_bytes_per_s();
        let members: Vec<u32> = (0..p).collect();
        let pf = p as f64;
        let bytes = 8e9;
        let (_, _, t) = lone_all_to_all(node, 1, None, &members, bytes);
        let floor = bytes * (pf - 1.0) / pf / port;
        assert!(t >= floor && t <= floor * 1.001 + 20e-6, "{node} p={p}: {t} s vs {floor} s");
        let (_, _, small) = lone_all_to_all(node, 1, None, &members, 1e6);
        assert!(small > 2.0 * 1e6 * (pf - 1.0) / pf / port, "{node} p={p}: {small} s");
    }
}

/// Across nodes the NICs bound it: (N-1)/N of each GPU's buffer crosses its rail's NIC (sjeaugey,
/// NVIDIA/nccl-tests #130: bus bandwidth N/(N-1) x the network bandwidth per GPU), twice as
/// long when two GPUs share a NIC; NVLink, 10x faster, is not what limits.
#[test]
fn all_to_all_across_nodes_is_limited_by_the_nics() {
    let nic = catalog::node_preset("dgx-a100-80gb").expect("preset").nic.effective_bytes_per_s();
    let bytes = 4e9;
    for (nodes, nics, per_gpu) in [(2u32, 8u32, 1.0), (4, 8, 1.0), (2, 4, 2.0)] {
        let members: Vec<u32> = (0..8 * nodes).collect();
        let (_, _, t) = lone_all_to_all("dgx-a100-80gb", nodes, Some(nics), &members, bytes);
        let nf = nodes as f64;
        let floor = per_gpu * bytes * (nf - 1.0) / nf / nic;
        assert!(t >= floor && t <= floor * 1.001 + 50e-6, "{nodes} nodes, {nics} NICs: {t} s vs {floor} s");
    }
}

/// A task standing for `calls` back-to-back calls of a collective (`Collective::calls`: a
/// post-step all-gather in a million small buckets) takes as long as that many tasks in a
/// row, launch and latency included, in one task's events, on plain rings and on NCCL's.
#[test]
fn one_task_of_n_calls_takes_as_long_as_n_calls_in_a_row() {
    let plain = cluster(4, 2, link(100e9, 2e-6), link(10e9, 5e-6));
    let mut nccl = catalog::node_preset("dgx-a100-80gb").expect("preset");
    nccl.devices = 4;
    nccl.nics = 4;
    for c in [plain, ClusterSpec::new(nccl, 2)] {
        let n = 8;
        let time = |tasks: u32, calls: u64| {
            let mut p = empty_program(n);
            let mut col = Collective::new(CollectiveKind::AllGather, (0..n).collect(), 2e5);
            col.calls = calls;
            p.collectives.push(col);
            let streams: Vec<u32> = (0..n).map(|d| Program::stream_index(d, StreamKind::DataParallel)).collect();
            for _ in 0..tasks {
                push(&mut p, TaskKind::Collective, 0, &streams, 0);
            }
            let o = RunOptions { collective_launch_ns: 3_000, ..opts() };
            let r = run(&p, &Topology::new(&c), &[], &HostCosts::default(), o).expect("runs");
            (r.iteration_ns, r.events)
        };
        let (one, _) = time(1, 1);
        let (seven_tasks, many_events) = time(7, 1);
        let (seven_calls, few_events) = time(1, 7);
        assert!(one > 3_000 && seven_tasks >= 7 * one - 7, "{one} {seven_tasks}");
        // Each step rounds its latency and end up to the nanosecond.
        assert!(seven_calls.abs_diff(seven_tasks) <= 7 * 4, "{seven_calls} vs {seven_tasks}");
        assert!(few_events < many_events, "{few_events} vs {many_events}");
    }
}

/// On Hopper a GEMM keeps a block on every SM until it ends (cuBLAS's persistent sm90
/// kernels): a data-parallel collective that becomes ready while one runs moves its first
/// byte only when the GEMM ends. On Ampere the GEMM's tile blocks free SMs as they finish,
/// and the collective starts at once. Here a second all-reduce follows a first on the
/// data-parallel stream and becomes ready in the middle of a 1 ms GEMM.
#[test]
fn an_overlapped_collective_waits_for_a_persistent_gemm_on_hopper_only() {
    for (node, waits) in [("dgx-h100", true), ("dgx-a100-80gb", false)] {
        let c = ClusterSpec::new(catalog::node_preset(node).expect("preset"), 1);
        let mut p = empty_program(2);
        p.labels.push(Label { op: "gemm", layer: 0, phase: Phase::Forward, chunk: 0 });
        p.ops.push(device_op(false));
        let mut gemm = device_op(false);
        gemm.spec.class = OpClass::Gemm { batch: 1.0, m: 8192.0, n: 8192.0, k: 8192.0 };
        p.ops.push(gemm);
        let op_ns = [100_000u64, 1_000_000];
        p.collectives.push(Collective::new(CollectiveKind::AllReduce, vec![0, 1], 1e6));
        p.collectives.push(Collective::new(CollectiveKind::AllReduce, vec![0, 1], 1e6));
        let mut first = Vec::new();
        for d in 0..2 {
            let s = Program::stream_index(d, StreamKind::Compute);
            first.push(push(&mut p, TaskKind::Compute, 0, &[s], 0));
            let g = push(&mut p, TaskKind::Compute, 1, &[s], 0);
            p.tasks[g as usize].label = 1;
        }
        let dp =
            [Program::stream_index(0, StreamKind::DataParallel), Program::stream_index(1, StreamKind::DataParallel)];
        let ar1 = push(&mut p, TaskKind::Collective, 0, &dp, 0);
        push(&mut p, TaskKind::Collective, 1, &dp, 0);
        p.deps.extend(first.iter().map(|&a| (a, ar1)));
        let o = RunOptions { record: true, ..opts() };
        let r = run(&p, &Topology::new(&c), &op_ns, &HostCosts::default(), o).expect("runs");
        let t = &r.timeline;
        let gemm_end = t.spans.iter().filter(|s| s.label == 1).map(|s| s.end_ns).max().expect("gemm spans");
        let gemm_start = t.spans.iter().filter(|s| s.label == 1).map(|s| s.start_ns).min().expect("gemm spans");
        let last_flow = t.flows.iter().map(|f| f.start_ns).max().expect("flows");
        let first_flow = t.flows.iter().map(|f| f.start_ns).min().expect("flows");
        assert!(first_flow < gemm_start + 50_000, "{node}: the first all-reduce starts beside the GEMM's start");
        if waits {
            assert!(
                last_flow >= gemm_end,
                "{node}: the second all-reduce waits for the GEMM ({last_flow} < {gemm_end})"
            );
        } else {
            assert!(last_flow < gemm_end - 500_000, "{node}: no wait ({last_flow} vs GEMM end {gemm_end})");
        }
    }
}

/// A data-parallel all-reduce beside a kernel on every member: beside a memory-bound one it
/// moves only its threads' share of the memory while the kernel runs (`hardware::kernels::
/// memory_share_beside_kernel`) and ends that much later, in either network model; beside a
/// GEMM it keeps its speed. The memory-bound kernel loses only the bytes the collective moves.
#[test]
fn an_overlapped_collective_slows_beside_a_memory_bound_kernel() {
    let c = ClusterSpec::new(catalog::node_preset("dgx-a100-80gb").expect("preset"), 1);
    let topo = Topology::new(&c);
    let kernel_ns = 2_000_000u64;
    let program = |class: Option<OpClass>| {
        let mut p = empty_program(8);
        p.collectives.push(Collective::new(CollectiveKind::AllReduce, (0..8).collect(), 1e9));
        let dp: Vec<u32> = (0..8).map(|d| Program::stream_index(d, StreamKind::DataParallel)).collect();
        push(&mut p, TaskKind::Collective, 0, &dp, 0);
        if let Some(class) = class {
            let mut op = device_op(false);
            op.spec.class = class;
            p.ops.push(op);
            for d in 0..8 {
                push(&mut p, TaskKind::Compute, 0, &[Program::stream_index(d, StreamKind::Compute)], 0);
            }
        }
        p
    };
    let gemm = OpClass::Gemm { batch: 1.0, m: 8192.0, n: 8192.0, k: 8192.0 };
    for network in [NetworkKind::MaxMinFair, NetworkKind::Ideal] {
        let o = RunOptions { network, record: true, ..opts() };
        let collective_end = |p: &Program| {
            let r = run(p, &topo, &[kernel_ns], &HostCosts::default(), o).expect("runs");
            let t = &r.timeline;
            let end = |k: StreamKind| t.spans.iter().filter(|s| s.stream == k).map(|s| s.end_ns).max().unwrap_or(0);
            (end(StreamKind::DataParallel), end(StreamKind::Compute))
        };
        let (alone, _) = collective_end(&program(None));
        let (beside_gemm, _) = collective_end(&program(Some(gemm)));
        let (beside_memory, kernel_end) = collective_end(&program(Some(OpClass::Memory)));
        // What the model says: the collective's threads' share of A100's streaming bandwidth.
        let x = super::expanded::Expanded::new(&program(None).collectives[0], &program(None), &topo);
        let stream = topo.hbm_bytes_per_s(0);
        let moved =
            crate::hardware::kernels::memory_share_beside_kernel(x.threads, 108.0, stream, x.hbm_bytes_per_s, 1.0);
        let g = moved / x.hbm_bytes_per_s;
        assert!(g < 0.5, "{network:?}: the collective keeps {g} of its speed");
        let kernel = kernel_ns as f64 / (1.0 - moved / stream);
        assert!((kernel_end as f64 - kernel).abs() < 2.0, "{network:?}: kernel {kernel_end} vs {kernel}");
        // From its first flow (after NCCL's latency) until the kernel ends the collective moves
        // at g; the rest at full speed.
        assert_eq!(x.steps.len(), 1);
        let want = alone as f64 + (kernel - x.steps[0].latency_ns as f64) * (1.0 - g);
        assert!(
            (beside_memory as f64 - want).abs() < 1e-3 * want,
            "{network:?}: beside the memory-bound kernel {beside_memory} vs {want} (alone {alone})"
        );
        assert_eq!(beside_gemm, alone, "{network:?}: beside a GEMM the collective keeps its speed");
    }
}
