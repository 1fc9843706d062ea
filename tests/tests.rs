//! Integration tests of the whole, one binary.

// Helpers shared by the modules: running the CLI, temporary folders, scenario builders.
mod util;

// The example scenarios, the report keys and the CLI's error behaviour (shared/SCENARIO.md).
mod contract;
// The executor: CPU replay, calibration and validation through the CLI, the CUDA error path.
mod executor;
// Training runs with freezing and elastic pipelines (PipeTransformer).
mod freezing;
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
// Simulated properties of reports: bandwidth, bubble, recomputation, ZeRO, fit, symmetry.
mod report;
// Workload models: preset sizes, layer FLOPs, Korthikanti activation memory, the HF reader.
mod workload;
