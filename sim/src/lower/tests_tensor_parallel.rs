//! Tensor-parallel communication beside the GEMMs: Transformer Engine's userbuffers
//! (`framework.tp_comm_overlap`) and Megatron's asynchronous column-parallel backward
//! (`framework.tp_async_backward`).

use super::Program;
use crate::report::timeline::{Phase, StreamKind};
use crate::scenario;

/// GPT (4 layers, h=4096) on one DGX H100 with tensor parallelism 8 and sequence parallelism
/// under Megatron-Core, Transformer Engine's tensor-parallel overlap on or off (the asynchronous
/// backward off: nothing overlapped).
fn tp_overlap(on: bool, sequence_parallel: bool) -> crate::Simulation {
    megatron(&format!(r#""tp_comm_overlap": {on}, "tp_async_backward": false"#), sequence_parallel)
}

/// The same GPT under Megatron-Core with the framework's overrides `knobs` (JSON members).
fn megatron(knobs: &str, sequence_parallel: bool) -> crate::Simulation {
    let text = format!(
        r#"{{"workload": {{"transformer": {{"layers": 4, "hidden": 4096, "heads": 32, "vocab": 32000}}}},
            "cluster": {{"node": "dgx-h100", "nodes": 1}},
            "training": {{"global_batch": 8, "micro_batch": 1, "seq_len": 4096,
                          "framework": {{"name": "megatron-core", {knobs}}}}},
            "plan": {{"tp": 8, "sequence_parallel": {sequence_parallel}}}}}"#
    );
    let s = scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
    crate::simulate(&s, false)
}

/// Megatron-Core's tensor-parallel overlap moves the all-gathers and all but the last chunk
/// of the reduce-scatters beside the GEMMs: the exposed tensor-parallel time falls but not to
/// zero (the reduce-scatters' last chunks stay), the iteration is shorter, and compute takes
/// longer: the GEMMs a reduce-scatter overlaps run on 116 of the H100's 132 SMs, and each
/// chunk of rows a pipelined collective cuts is a kernel of its own. Without sequence
/// parallelism there is nothing it overlaps.
#[test]
fn tensor_parallel_overlap_hides_all_gathers_and_most_reduce_scatters() {
    let exposed = |sim: &crate::Simulation| sim.report.time_breakdown[0].exposed_tp_comm_s;
    let (on, off) = (tp_overlap(true, true), tp_overlap(false, true));
    let tp_streams = |sim: &crate::Simulation| {
        (0..sim.program.devices.len() as u32)
            .map(|d| sim.program.streams[super::Program::stream_index(d, StreamKind::TensorParallel) as usize].len())
            .sum::<usize>()
    };
    assert!(tp_streams(&on) > 0 && tp_streams(&off) == 0);
    assert!(on.report.iteration_s < off.report.iteration_s, "{} vs {}", on.report.iteration_s, off.report.iteration_s);
    assert!(exposed(&on) > 0.0 && exposed(&on) < 0.5 * exposed(&off), "{} vs {}", exposed(&on), exposed(&off));
    let compute = |sim: &crate::Simulation| sim.report.time_breakdown[0].compute_s();
    // Compute grows by the narrowed GEMMs' 132/116 and by the chunks' own waves: here each
    // chunk of the gathered 4,096 rows is a 512-row GEMM, three running at once.
    let grown = compute(&on) / compute(&off);
    assert!(grown > 1.0 && grown < 1.25, "{grown}");
    // The hidden time is at most the communication the overlap moved off the compute stream.
    let saved = off.report.iteration_s - on.report.iteration_s;
    assert!(saved <= exposed(&off) - exposed(&on) + 1e-9, "{saved}");
    let (on1, off1) = (tp_overlap(true, false), tp_overlap(false, false));
    assert_eq!(on1.report.iteration_s, off1.report.iteration_s);
    assert_eq!(tp_streams(&on1), 0);
}

/// Tasks on the devices' streams of `kind`.
fn stream_tasks(sim: &crate::Simulation, kind: StreamKind) -> usize {
    (0..sim.program.devices.len() as u32)
        .map(|d| sim.program.streams[super::Program::stream_index(d, kind) as usize].len())
        .sum()
}

/// Bytes of device 0's backward collectives of `kind` labelled as a column-parallel layer's
/// input (`attn_in`, `mlp_in`, `head_in`).
fn column_backward_bytes(sim: &crate::Simulation, kind: super::CollectiveKind) -> f64 {
    let p = &sim.program;
    p.tasks
        .iter()
        .filter(|t| t.kind == super::TaskKind::Collective)
        .filter(|t| {
            let l = &p.labels[t.label as usize];
            l.phase == Phase::Backward && ["attn_in", "mlp_in", "head_in"].contains(&l.op)
        })
        .map(|t| &p.collectives[t.payload as usize])
        .filter(|c| c.kind == kind && c.members.contains(&0))
        .map(|c| c.bytes)
        .sum()
}

/// Megatron's asynchronous column-parallel backward: under sequence parallelism the input is
/// all-gathered again (as many bytes as the input gradient's reduce-scatter moves) and both
/// run on an NCCL stream beside the layer's backward GEMMs, so less tensor-parallel time is
/// exposed and the iteration is shorter, while the GEMMs they overlap run on fewer SMs (the
/// compute time grows). Off (Megatron-LM 2021's order), nothing is re-gathered and the
/// reduce-scatter holds the compute stream.
#[test]
fn async_column_backward_regathers_the_input_beside_the_gemms() {
    use super::CollectiveKind::{AllGather, AllReduce, ReduceScatter};
    let exposed = |sim: &crate::Simulation| sim.report.time_breakdown[0].exposed_tp_comm_s;
    let compute = |sim: &crate::Simulation| sim.report.time_breakdown[0].compute_s();
    let knobs = |on: bool| format!(r#""tp_comm_overlap": false, "tp_async_backward": {on}"#);
    let (on, off) = (megatron(&knobs(true), true), megatron(&knobs(false), true));
    assert!(stream_tasks(&on, StreamKind::TensorAsync) > 0 && stream_tasks(&off, StreamKind::TensorAsync) == 0);
    let reduced = column_backward_bytes(&on, ReduceScatter);
    assert!(reduced > 0.0 && reduced == column_backward_bytes(&off, ReduceScatter));
    assert_eq!(column_backward_bytes(&on, AllGather), reduced);
    assert_eq!(column_backward_bytes(&off, AllGather), 0.0);
    assert!(exposed(&on) < exposed(&off), "{} vs {}", exposed(&on), exposed(&off));
    assert!(on.report.iteration_s < off.report.iteration_s);
    assert!(compute(&on) > compute(&off), "{} vs {}", compute(&on), compute(&off));
    // Without sequence parallelism: the input gradient's all-reduce beside the GEMMs, no
    // re-gather.
    let (on1, off1) = (megatron(&knobs(true), false), megatron(&knobs(false), false));
    assert_eq!(column_backward_bytes(&on1, AllGather), 0.0);
    assert!(column_backward_bytes(&on1, AllReduce) > 0.0);
    assert!(on1.report.iteration_s < off1.report.iteration_s);
    // Megatron-Core's profile runs it; Megatron-LM of 2021 did not.
    let profile = |name: &str| crate::framework::profile(name).expect("profile").tp_async_backward;
    assert!(profile("megatron-core") && !profile("megatron-lm-2021") && !profile("pytorch-fsdp"));
}

/// Under Transformer Engine's userbuffers the column-parallel backward's re-gather and
/// reduce-scatter are bulk overlaps on the userbuffers' stream: none on an NCCL stream, the
/// re-gather's bytes there as well.
#[test]
fn userbuffers_run_the_column_backward_as_bulk_overlaps() {
    let sim = megatron(r#""tp_comm_overlap": true, "tp_async_backward": true"#, true);
    assert_eq!(stream_tasks(&sim, StreamKind::TensorAsync), 0);
    let reduced = column_backward_bytes(&sim, super::CollectiveKind::ReduceScatter);
    assert!(reduced > 0.0);
    assert_eq!(column_backward_bytes(&sim, super::CollectiveKind::AllGather), reduced);
}

/// The split column-parallel backward keeps Megatron's order: the input gradient's reduction
/// starts after the data-gradient product, and the weight-gradient product after the
/// re-gathered input; the two products run as the two GEMMs they are (dX = dY . W^T,
/// dW = X^T . dY), each half the backward's time.
#[test]
fn the_column_backward_reduces_after_the_data_gradient() {
    use super::{CollectiveKind, OpPart, TaskKind};
    let sim = megatron(r#""tp_comm_overlap": false, "tp_async_backward": true"#, true);
    let p = &sim.program;
    let part = |t: u32| {
        let task = &p.tasks[t as usize];
        (task.kind == TaskKind::Compute).then(|| p.ops[task.payload as usize].part)
    };
    let mut checked = 0;
    for (id, t) in p.tasks.iter().enumerate() {
        if Program::stream_kind(t.stream) != StreamKind::TensorAsync {
            continue;
        }
        let kind = p.collectives[t.payload as usize].kind;
        let before: Vec<Option<OpPart>> = p.deps.iter().filter(|d| d.1 == id as u32).map(|d| part(d.0)).collect();
        let after: Vec<Option<OpPart>> = p.deps.iter().filter(|d| d.0 == id as u32).map(|d| part(d.1)).collect();
        match kind {
            CollectiveKind::ReduceScatter => assert!(before.contains(&Some(OpPart::DataGrad)), "{before:?}"),
            CollectiveKind::AllGather => assert!(after.contains(&Some(OpPart::WeightGrad)), "{after:?}"),
            k => panic!("{k:?} on the asynchronous stream"),
        }
        checked += 1;
    }
    assert!(checked > 0);
    let op = p.ops.iter().find(|o| o.part == OpPart::DataGrad).expect("a split GEMM");
    let (b, m, n, k) = op.spec.class.gemm_shape().expect("a GEMM");
    assert_eq!(op.gemm(), Some((b, m, k, n, false)));
    let w = super::OpInstance { part: OpPart::WeightGrad, ..op.clone() };
    assert_eq!(w.gemm(), Some((b, k, n, m, false)));
    assert_eq!((op.share(), w.share()), (0.5, 0.5));
}

/// Under sequence parallelism DTensor's layers keep the all-gathered input of the attention's
/// and the MLP's input projections where Megatron's keep their shard: at the peak (the end of
/// a micro-batch's forward, no recomputation) each layer holds 2 x (1 - 1/t) x s b h more
/// activation bytes; without sequence parallelism the input is whole either way.
#[test]
fn dtensor_layers_keep_the_gathered_input() {
    let knobs = |keep: bool| format!(r#""tp_comm_overlap": false, "tp_keeps_gathered_input": {keep}"#);
    let acts = |sim: &crate::Simulation| sim.report.memory_breakdown.activations;
    let (kept, sharded) = (megatron(&knobs(true), true), megatron(&knobs(false), true));
    // 4 layers, s = 4,096, b = 1, h = 4,096, bf16, t = 8.
    let expected = 4.0 * 2.0 * 2.0 * 4096.0 * 4096.0 * (1.0 - 1.0 / 8.0);
    let grown = acts(&kept) - acts(&sharded);
    assert!((grown - expected).abs() < 1e-6 * expected, "{grown} vs {expected}");
    let (kept1, sharded1) = (megatron(&knobs(true), false), megatron(&knobs(false), false));
    assert_eq!(acts(&kept1), acts(&sharded1));
    let profile = |name: &str| crate::framework::profile(name).expect("profile").tp_keeps_gathered_input;
    assert!(profile("pytorch-fsdp") && !profile("megatron-core") && !profile("megatron-lm-2021"));
}

/// DTensor's `ColwiseParallel(input_layouts=Shard(1))` on each separate projection with no
/// `PrepareModuleInput` (`tp_gather_per_projection`): under sequence parallelism a Llama-style
/// layer all-gathers the norm's output once per projection (q, k, v; gate, up: 5 where one
/// gather per block makes 2) and reduce-scatters each projection's input gradient. Fused
/// projections, no sequence parallelism or Transformer Engine's overlap leave it as it was.
#[test]
fn each_separate_projection_gathers_its_own_input() {
    let run = |knobs: &str, sp: bool| {
        let text = format!(
            r#"{{"workload": {{"transformer": {{"layers": 2, "hidden": 1024, "heads": 16, "kv_heads": 8,
                    "vocab": 32000, "mlp": "swiglu", "norm": "rmsnorm", "rotary": true}}}},
                "cluster": {{"node": "dgx-h100", "nodes": 1}},
                "training": {{"global_batch": 2, "micro_batch": 1, "seq_len": 1024,
                              "framework": {{"name": "pytorch-fsdp", {knobs}}}}},
                "plan": {{"tp": 8, "sequence_parallel": {sp}}}}}"#
        );
        let s = scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
        let sim = crate::simulate(&s, false);
        let p = &sim.program;
        // Tensor-parallel collectives of layer 0 on device 0, per phase.
        let count = |phase: Phase| {
            p.tasks
                .iter()
                .filter(|t| t.kind == super::TaskKind::Collective)
                .filter(|t| {
                    let l = &p.labels[t.label as usize];
                    l.layer == 0 && l.phase == phase && l.chunk == 0
                })
                .filter(|t| {
                    let c = &p.collectives[t.payload as usize];
                    c.members.contains(&0) && c.members.len() == 8
                })
                .count()
        };
        (count(Phase::Forward), count(Phase::Backward))
    };
    let separate = r#""fused": {"projections": false}"#;
    let per = format!(r#"{separate}, "tp_gather_per_projection": true"#);
    let (once_f, once_b) = run(separate, true);
    let (each_f, each_b) = run(&per, true);
    // Per micro-batch: 2 gathers + 2 reduce-scatters a block forward become 5 + 2, and the same
    // backward (5 reduce-scatters of input gradients + 2 gathers); two micro-batches.
    assert_eq!((once_f, once_b), (2 * 4, 2 * 4), "one gather per block");
    assert_eq!((each_f, each_b), (2 * 7, 2 * 7), "one gather per projection");
    // Fused projections, or no sequence parallelism: nothing changes.
    let fused = r#""fused": {"projections": true}, "tp_gather_per_projection": true"#;
    assert_eq!(run(fused, true), run(r#""fused": {"projections": true}"#, true));
    assert_eq!(run(&per, false), run(separate, false));
    assert!(!crate::framework::profile("pytorch-fsdp").expect("profile").tp_gather_per_projection);
}

/// DTensor's head with `output_layouts=Replicate()` and no `loss_parallel`
/// (`tp_replicate_logits`): the logits are all-gathered to every rank in forward (nothing in
/// backward) and the loss reads the whole vocabulary on each, t times the bytes of the sharded
/// loss.
#[test]
fn replicated_logits_gather_the_vocabulary_and_run_the_whole_loss() {
    let run = |replicate: bool| {
        let text = format!(
            r#"{{"workload": {{"transformer": {{"layers": 2, "hidden": 1024, "heads": 16, "vocab": 32768}}}},
                "cluster": {{"node": "dgx-h100", "nodes": 1}},
                "training": {{"global_batch": 1, "micro_batch": 1, "seq_len": 1024,
                              "framework": {{"name": "pytorch-fsdp", "tp_replicate_logits": {replicate}}}}},
                "plan": {{"tp": 8, "sequence_parallel": true}}}}"#
        );
        let s = scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
        let sim = crate::simulate(&s, false);
        let p = &sim.program;
        let of = |op: &str| -> Vec<(Phase, f64)> {
            p.tasks
                .iter()
                .filter(|t| p.labels[t.label as usize].op == op && t.kind == super::TaskKind::Collective)
                .filter(|t| p.collectives[t.payload as usize].members.contains(&0))
                .map(|t| (p.labels[t.label as usize].phase, p.collectives[t.payload as usize].bytes))
                .collect()
        };
        let loss_bytes: f64 = s
            .workload
            .transformer
            .head_ops(s.plan.layer_shape())
            .iter()
            .filter_map(|o| o.compute())
            .filter(|c| c.name == "loss")
            .map(|c| c.forward_bytes)
            .sum();
        (of("logits_gather"), loss_bytes)
    };
    let (none, sharded) = run(false);
    let (gathers, whole) = run(true);
    assert!(none.is_empty());
    // One forward all-gather of the bf16 logits: 1,024 tokens x 32,768 classes x 2 bytes.
    assert_eq!(gathers, vec![(Phase::Forward, 1024.0 * 32768.0 * 2.0)]);
    assert!((whole / sharded - 8.0).abs() < 1e-9, "{whole} vs {sharded}");
}

/// KempnerForge's replicated token embedding (`tp_replicate_embedding`): every tensor-parallel
/// rank holds the whole table (t times the vocabulary-parallel one's bytes), and under
/// sequence parallelism the forward's reduce-scatter of the partial lookups is gone while the
/// backward still gathers the output's gradient; without sequence parallelism nothing is
/// communicated. Tied embeddings refuse it.
#[test]
fn a_replicated_embedding_is_whole_on_every_rank_and_sums_nothing() {
    let text = |replicate: bool, sp: bool, tied: bool| {
        format!(
            r#"{{"workload": {{"transformer": {{"layers": 2, "hidden": 1024, "heads": 16, "vocab": 32768, "tied_embeddings": {tied}}}}},
                "cluster": {{"node": "dgx-h100", "nodes": 1}},
                "training": {{"global_batch": 1, "micro_batch": 1, "seq_len": 1024,
                              "framework": {{"name": "pytorch-fsdp", "tp_replicate_embedding": {replicate}}}}},
                "plan": {{"tp": 8, "sequence_parallel": {sp}, "zero_stage": 0}}}}"#
        )
    };
    let run = |replicate: bool, sp: bool| {
        let s =
            scenario::parse(&text(replicate, sp, false), &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
        let sim = crate::simulate(&s, false);
        let p = &sim.program;
        let embed: Vec<(Phase, super::CollectiveKind)> = p
            .tasks
            .iter()
            .filter(|t| p.labels[t.label as usize].op == "embed_out" && t.kind == super::TaskKind::Collective)
            .filter(|t| p.collectives[t.payload as usize].members.contains(&0))
            .map(|t| (p.labels[t.label as usize].phase, p.collectives[t.payload as usize].kind))
            .collect();
        (embed, p.static_memory[0].weights)
    };
    use super::CollectiveKind::{AllGather, ReduceScatter};
    let (split, split_weights) = run(false, true);
    let (whole, whole_weights) = run(true, true);
    assert_eq!(split, vec![(Phase::Forward, ReduceScatter), (Phase::Backward, AllGather)]);
    assert_eq!(whole, vec![(Phase::Backward, AllGather)]);
    // The table (32,768 x 1,024 bf16) is 1/8 on each rank when split, whole when replicated
    // (with the final norm's 2,048 parameters, counted with the first stage's).
    let table = 32768.0 * 1024.0 * 2.0;
    let grown = whole_weights - split_weights;
    assert!((grown - table * 7.0 / 8.0).abs() < 1e-3 * table, "{whole_weights} vs {split_weights}");
    assert!(run(true, false).0.is_empty());
    let tied = scenario::parse(&text(true, true, true), &|_| Err("no files".into()));
    assert!(tied.is_err_and(|e| e.to_string().contains("tp_replicate_embedding")));
}

/// DTensor's sequence-dimension collectives (`tp_layout_copies`, on in `pytorch-fsdp`): each
/// all-gather of a `[batch, sequence, hidden]` activation is followed, and each reduce-scatter
/// preceded, by a copy of the whole tensor on the compute stream (a read and a write), in both
/// passes; torchao's float8 tensor parallelism gathers the forward input in fp8 (half the
/// bytes, and half the copy); Megatron's layers (`tp_async_backward`) and the overlapped
/// collectives of `tp_comm_overlap` copy nothing.
#[test]
fn sequence_dimension_collectives_copy_their_buffer_under_dtensor() {
    let (h, s, b, layers) = (1024.0, 1024.0, 2.0, 2u32);
    let run = |knobs: &str, precision: &str| {
        let text = format!(
            r#"{{"workload": {{"transformer": {{"layers": {layers}, "hidden": 1024, "heads": 16, "vocab": 32000}}}},
                "cluster": {{"node": "dgx-h100", "nodes": 1}},
                "training": {{"global_batch": 2, "micro_batch": 2, "seq_len": 1024, "precision": "{precision}",
                              "framework": {{"name": "pytorch-fsdp", "fp8_casts": "torchao" {knobs}}}}},
                "plan": {{"tp": 8, "sequence_parallel": true}}}}"#
        );
        let s = scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
        let sim = crate::simulate(&s, false);
        let p = &sim.program;
        // Bytes of layer 0's copies on device 0, and its gathers' bytes, per phase.
        let copies = |phase: Phase| -> f64 {
            p.tasks
                .iter()
                .filter(|t| t.kind == super::TaskKind::Compute)
                .filter(|t| {
                    let l = &p.labels[t.label as usize];
                    l.layer == 0 && l.phase == phase && l.op == "tp_layout_copy"
                })
                .filter(|t| Program::stream_device(t.stream) == 0)
                .map(|t| {
                    let o = &p.ops[t.payload as usize];
                    if o.backward { o.spec.backward_bytes } else { o.spec.forward_bytes }
                })
                .sum()
        };
        let gathered = p
            .tasks
            .iter()
            .filter(|t| t.kind == super::TaskKind::Collective)
            .filter(|t| {
                let l = &p.labels[t.label as usize];
                l.layer == 0 && l.phase == Phase::Forward && (l.op == "attn_in" || l.op == "mlp_in")
            })
            .map(|t| p.collectives[t.payload as usize].bytes)
            .fold(0.0, f64::max);
        (copies(Phase::Forward), copies(Phase::Backward), gathered, sim.report.iteration_s)
    };
    // bf16: two gathers and two reduce-scatters a layer, each copying 2 x (2 bytes x s b h).
    let full = 2.0 * s * b * h;
    let (fwd, bwd, gathered, with) = run("", "bf16");
    assert_eq!((fwd, bwd, gathered), (4.0 * 2.0 * full, 4.0 * 2.0 * full, full));
    let (f0, b0, _, without) = run(r#", "tp_layout_copies": false"#, "bf16");
    assert_eq!((f0, b0), (0.0, 0.0));
    assert!(with > without, "{with} vs {without}");
    // fp8 with torchao's casts: the two forward gathers move a byte an element and copy half.
    let (fwd8, bwd8, gathered8, _) = run("", "fp8");
    assert_eq!((fwd8, bwd8, gathered8), (2.0 * 2.0 * full / 2.0 + 2.0 * 2.0 * full, 4.0 * 2.0 * full, full / 2.0));
    // Megatron's layers and the overlapped collectives copy nothing.
    for knobs in [r#", "tp_async_backward": true"#, r#", "tp_comm_overlap": true"#] {
        let (f, b, _, _) = run(knobs, "bf16");
        assert_eq!((f, b), (0.0, 0.0), "{knobs}");
    }
    let profile = |name: &str| crate::framework::profile(name).expect("profile").tp_layout_copies;
    assert!(profile("pytorch-fsdp") && profile("pytorch-ddp") && !profile("megatron-core") && !profile("deepspeed"));
}

/// A small Llama (2 layers, h=1024, 8 key-value heads) on one DGX H100 under `pytorch-fsdp`
/// with tensor parallelism 8, sequence parallelism and the TP overlap on, `seq_len` tokens,
/// the framework's further members `knobs` (JSON, each after a comma); every span recorded.
fn overlapped_llama(seq_len: u32, knobs: &str) -> crate::Simulation {
    let text = format!(
        r#"{{"workload": {{"transformer": {{"layers": 2, "hidden": 1024, "heads": 16, "kv_heads": 8,
                "vocab": 32000, "mlp": "swiglu", "norm": "rmsnorm", "rotary": true}}}},
            "cluster": {{"node": "dgx-h100", "nodes": 1}},
            "training": {{"global_batch": 1, "micro_batch": 1, "seq_len": {seq_len},
                          "framework": {{"name": "pytorch-fsdp", "tp_comm_overlap": true {knobs}}}}},
            "plan": {{"tp": 8, "sequence_parallel": true}}}}"#
    );
    let s = scenario::parse(&text, &|_| Err("no files".into())).unwrap_or_else(|e| panic!("{e}"));
    crate::simulate(&s, true)
}

/// PyTorch's micro-pipelined TP (`tp_micro_pipeline`, under `tp_comm_overlap`) fuses a
/// reduce-scatter only with the one GEMM producing its input: with separate projections the
/// backward's two input-gradient reduce-scatters of a layer run on the compute stream, where
/// Transformer Engine's overlap runs them beside the weight-gradient GEMM; with a fused
/// projection they stay beside it, and the kept gathered input is not gathered again.
#[test]
fn micro_pipelined_tp_leaves_summed_input_gradients_unfused() {
    let run = |knobs: &str| {
        let sim = overlapped_llama(1024, knobs);
        let p = &sim.program;
        // Layer 0's backward collectives on device 0: (kind, on the compute stream).
        let mut out: Vec<(super::CollectiveKind, bool)> = p
            .tasks
            .iter()
            .filter(|t| t.kind == super::TaskKind::Collective)
            .filter(|t| {
                let l = &p.labels[t.label as usize];
                l.layer == 0 && l.phase == Phase::Backward
            })
            .filter(|t| p.collectives[t.payload as usize].members.contains(&0))
            .map(|t| (p.collectives[t.payload as usize].kind, Program::stream_kind(t.stream) == StreamKind::Compute))
            .collect();
        out.sort_by_key(|&(k, c)| (format!("{k:?}"), c));
        out
    };
    use super::CollectiveKind::{AllGather, ReduceScatter};
    let separate = r#", "fused": {"projections": false}"#;
    // PyTorch's: the two input-gradient reduce-scatters on the compute stream; the two
    // output-gradient gathers fused beside their GEMMs.
    let torch = run(separate);
    assert_eq!(torch, vec![(AllGather, false), (AllGather, false), (ReduceScatter, true), (ReduceScatter, true)]);
    // Transformer Engine's: beside the weight-gradient GEMMs, each after a re-gather of the
    // kept shard.
    let te = run(&format!(r#"{separate}, "tp_micro_pipeline": false"#));
    assert_eq!(te.iter().filter(|c| c.1).count(), 0, "{te:?}");
    assert_eq!(te.iter().filter(|c| c.0 == AllGather).count(), 4, "{te:?}");
    // Fused projections under PyTorch's: beside the GEMM, with no re-gather.
    let fused = run(r#", "fused": {"projections": true}"#);
    assert_eq!(fused, vec![(AllGather, false), (AllGather, false), (ReduceScatter, false), (ReduceScatter, false)]);
    let profile = |name: &str| crate::framework::profile(name).expect("profile").tp_micro_pipeline;
    assert!(profile("pytorch-fsdp") && !profile("megatron-core"));
}

/// PyTorch's fused all-gather-matmul and matmul-reduce-scatter (`TpOverlap`, micro-pipelined):
/// on layer 0 of device 0, each fused gather follows a copy of the shard into symmetric memory
/// and runs beside all but one rank's chunk of its GEMMs (the q, k and v projections), that
/// chunk after it; the output projection's first chunk runs before its reduce-scatter's pulls,
/// the rest beside them, and the partial sums are added after them; in backward the output
/// projection's weight gradient waits for the whole gathered gradient. No GEMM gives up SMs
/// (the copy engines move the bytes). Transformer Engine's overlap has none of these ops.
#[test]
fn pytorch_fused_collectives_chunk_their_gemms() {
    let run = |knobs: &str| overlapped_llama(4096, &format!(r#", "fused": {{"projections": false}} {knobs}"#));
    let sim = run("");
    let t = &sim.timeline;
    // Layer 0's spans of `op` in `phase` on device 0, in time order: (stream, start, end).
    let spans = |op: &str, phase: Phase| {
        let mut v: Vec<(StreamKind, u64, u64)> = t
            .spans
            .iter()
            .filter(|s| s.device == 0)
            .filter(|s| {
                let l = &t.labels[s.label as usize];
                l.layer == 0 && l.phase == phase && l.op == op
            })
            .map(|s| (s.stream, s.start_ns, s.end_ns))
            .collect();
        v.sort_by_key(|s| s.1);
        v
    };
    let one = |op: &str, phase: Phase| {
        let v = spans(op, phase);
        assert_eq!(v.len(), 1, "{op} {phase:?}: {v:?}");
        v[0]
    };
    let gather = one("attn_in", Phase::Forward);
    assert_eq!(gather.0, StreamKind::TensorParallel);
    // (One copy before each of the layer's two gathers, one sum after each reduce-scatter.)
    let copies = spans("tp_symm_copy", Phase::Forward);
    assert_eq!(copies.len(), 2, "{copies:?}");
    assert!(copies[0].2 <= gather.1, "the shard is copied before the pulls");
    // The other ranks' chunks (seven kernels of 512 rows, two at once, one task) follow the shard's
    // copy, q's beside the gather; each projection's own chunk waits for the gather.
    for proj in ["q_proj", "k_proj", "v_proj"] {
        let v = spans(proj, Phase::Forward);
        assert_eq!(v.len(), 2, "{proj}: {v:?}");
        assert!(v[0].1 >= copies[0].2 && v[0].2 <= v[1].1, "{proj}: {v:?}");
        assert!(proj != "q_proj" || v[0].1 < gather.2, "q's other ranks' chunks run beside the gather");
        assert!(v[1].1 >= gather.2, "{proj}'s own chunk waits for the gather");
    }
    let pulls = one("attn_out", Phase::Forward);
    let out = spans("out_proj", Phase::Forward);
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out[0].2 <= pulls.1 && out[1].1 < pulls.2, "first chunk before the pulls, the rest beside");
    let sums = spans("tp_reduce_partials", Phase::Forward);
    assert!(sums.len() == 2 && sums[0].1 >= pulls.2, "{sums:?}");
    let grad_gather = one("attn_out", Phase::Backward);
    let back = spans("out_proj", Phase::Backward);
    assert_eq!(back.len(), 3, "{back:?}");
    assert!(back[0].1 < grad_gather.2 && back[2].1 >= grad_gather.2, "the weight gradient waits for the gather");
    // The ops' sizes: a shard copied (read and written), the stacked partials read and the
    // shard written.
    let p = &sim.program;
    let comm_bytes = p
        .tasks
        .iter()
        .filter(|task| task.kind == super::TaskKind::Collective && p.labels[task.label as usize].op == "attn_out")
        .map(|task| p.collectives[task.payload as usize].bytes)
        .next()
        .expect("a reduce-scatter");
    let op_bytes = |name: &str| p.ops.iter().find(|o| o.spec.name == name).expect(name).spec.forward_bytes;
    assert!((op_bytes("tp_symm_copy") - 2.0 * comm_bytes / 8.0).abs() < 1e-6 * comm_bytes);
    assert!((op_bytes("tp_reduce_partials") - comm_bytes * 9.0 / 8.0).abs() < 1e-6 * comm_bytes);
    assert!(p.ops.iter().all(|o| o.sm_share == 1.0), "copy engines take no SM");
    // Every chunk is a kernel of an eighth of the rows: the rank's own, or the seven others',
    // two at a time (as 3.5 kernels of a quarter).
    let chunks: Vec<(f64, f64)> = p.ops.iter().filter(|o| o.rows != 1.0).map(|o| (o.rows, o.chunks)).collect();
    assert!(!chunks.is_empty(), "no chunk");
    assert!(chunks.iter().all(|&c| c == (1.0 / 8.0, 1.0) || c == (2.0 / 8.0, 3.5)), "{chunks:?}");
    // Transformer Engine's userbuffers: none of PyTorch's ops; its ring exchange fuses only
    // the GEMM right after the gather (q, whose last chunk follows the gather; k and v
    // whole after it), and the weight gradient still waits for the whole gathered gradient.
    let te = run(r#", "tp_micro_pipeline": false"#);
    let names: Vec<&str> = te.program.ops.iter().map(|o| o.spec.name).collect();
    assert!(!names.contains(&"tp_symm_copy") && !names.contains(&"tp_reduce_partials"));
    let tt = &te.timeline;
    let count = |op: &str, phase: Phase| {
        tt.spans
            .iter()
            .filter(|s| s.device == 0 && s.stream == StreamKind::Compute)
            .filter(|s| {
                let l = &tt.labels[s.label as usize];
                l.layer == 0 && l.phase == phase && l.op == op
            })
            .count()
    };
    assert_eq!((count("q_proj", Phase::Forward), count("k_proj", Phase::Forward)), (2, 1));
    // Its pipelined reduce-scatter: the first of four chunks, then the rest beside the scatter.
    assert_eq!(count("out_proj", Phase::Forward), 2);
    let chunks: Vec<(f64, f64)> = te.program.ops.iter().filter(|o| o.rows != 1.0).map(|o| (o.rows, o.chunks)).collect();
    // (The reduce-scatter's other three quarters at once, the gather's seven eighths three at
    // a time.)
    for want in [(0.25, 1.0), (0.75, 1.0), (0.125, 1.0), (0.375, 7.0 / 3.0)] {
        assert!(chunks.contains(&want), "{want:?} in {chunks:?}");
    }
    assert_eq!(count("out_proj", Phase::Backward), 3);
    assert!(te.report.iteration_s < sim.report.iteration_s * 1.5 && sim.report.iteration_s > 0.0);
}
