//! Integration tests of the whole, one binary.

// Helpers shared by the modules: running the CLI, temporary folders, scenario builders.
mod util;

// The example scenarios, the report keys and the CLI's error behaviour (docs/, and the contract's examples).
mod contract;
// The user's reference (docs/) against the parser, the schema and the reports.
mod docs;
// The executor: CPU replay, calibration and validation through the CLI, the CUDA error path.
mod executor;
// Training runs with freezing and elastic pipelines (PipeTransformer).
mod freezing;
// Expert parallelism (plan.ep): all-to-all layout, parameters, FLOPs, refusals.
mod expert_parallel;
// Context parallelism (plan.cp): activations, the ring beside attention, refusals.
mod context_parallel;
// Tensor-parallel modes (1D, 2D, 2.5D, 3D): collective volumes, memory, end-to-end runs.
mod parallelism;
// Offload policies (Gemini, ZeRO-Offload, ZeRO-Infinity) and capacity search.
mod offload;
// Token slicing (TeraPipe): lowering, memory, the report, validation.
mod slicing;
// Pipeline partitioning: balanced and parameter policies, the partition command.
mod partition;
// Commands built on policies (train-run, partition, capacity): regression inputs end in a
// sane report or a clear error.
mod policy_regressions;
// Where the time goes: the report's per-device-class breakdown, HFU.
mod breakdown;
// Simulated properties of reports: bandwidth, bubble, recomputation, ZeRO, fit, symmetry.
mod report;
// One tensor rank per group and one replica simulated and mirrored: the full simulation's report.
mod symmetry;
// Per-kernel time variability: collectives wait for their slowest member, seeded.
mod variability;
// Compute kernels (fused attention, GEMM shapes) against published microbenchmarks.
mod kernels;
// The kernel model against trainsim's own microbenchmarks on a real GPU (H200, session 18).
mod gpu_microbench;
// Whole blocks' steps on real GPUs against what trainsim charges a layer.
mod gpu_blocks;
// Honest answers: allocator headroom, fp8, mixture-of-experts, profiles of other devices, tp across nodes.
mod honest;
// Traces (filters, Perfetto protobuf), output paths checked first, replay limits.
mod outputs;
// Collectives as NCCL runs them (trainsim nccl-test) against published nccl-tests curves.
mod nccl;
// Today's hardware presets (B200, GB200 NVL72, MI300X, H200 NVL) end to end.
mod hardware;
// Plan search (trainsim search): the written best plan, thread-count independence, constraints.
mod search;
// Workload models: preset sizes, layer FLOPs, Korthikanti activation memory, the HF reader.
/// Whole training runs: failures, checkpoints, goodput.
mod whole_run;
mod workload;
// Inputs that once crashed or gave impossible numbers (tests/data/regressions): each ends in a
// clear error or a physically possible report.
mod regressions;
