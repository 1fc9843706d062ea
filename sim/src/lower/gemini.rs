//! Gemini in the lowering (SEEDS §4.4): the plan is lowered twice. The warm-up lowering keeps
//! every chunk on the device and logs each unit's access (a layer, the embedding, the head) with
//! its first compute task; [`warmup_non_model`] then reads, off each device's compute stream,
//! the memory outside model data at every unit boundary (activations alive, the peak over the
//! period until the next access), which is what Gemini's `MemStatsCollector` samples. The
//! second lowering packs the stage's parameters into chunks in first-use order (with the
//! chunk-size search), replays [`gemini::place`] over the access trace in steady state (twice:
//! the second walk starts from the chunks the first left resident), and emits the moves as host
//! copies before each unit; the optimizer runs where each chunk lives ([`Split`]).

use crate::policy::gemini::{self, Access, ChunkSearch, Eviction, Move, STEADY_CUDA_CAP_RATIO};

use super::{NONE, Program};
use crate::report::timeline::StreamKind;

/// One unit access of the warm-up lowering (for the TP group's first device).
#[derive(Clone, Copy, Debug)]
pub(super) struct UnitAccess {
    /// Index into [`Program::devices`] of the group's first device.
    pub device: u32,
    /// The unit: a layer index, -1 for the embedding, -2 for the head.
    pub unit: i32,
    /// Parameters of the unit on one tensor-parallel rank (before data-parallel sharding).
    pub params: f64,
    /// The unit's first compute task on that device.
    pub first_task: u32,
}

/// Non-model bytes (activations and dynamic buffers) at each access of `log`, in order: the
/// level when the unit's first task starts and its peak until the next access of the same
/// device (or the end of the stream), walking the device's compute stream in order.
pub(super) fn warmup_non_model(p: &Program, log: &[UnitAccess]) -> Vec<f64> {
    let mut out = vec![0.0; log.len()];
    let mut devices: Vec<u32> = log.iter().map(|a| a.device).collect();
    devices.sort_unstable();
    devices.dedup();
    for d in devices {
        let stream = &p.streams[Program::stream_index(d, StreamKind::Compute) as usize];
        // Running level after each task (its start and end events applied), and the peak
        // while it runs.
        let mut level = 0.0f64;
        let mut peak_at = Vec::with_capacity(stream.len());
        let mut pos_of = std::collections::HashMap::new();
        for (pos, &t) in stream.iter().enumerate() {
            pos_of.insert(t, pos);
            let mut peak = level;
            for at_end in [false, true] {
                let mut m = p.tasks[t as usize].memory;
                while m != NONE {
                    let ev = p.memory_events[m as usize];
                    if ev.device == d && ev.at_end == at_end {
                        level += ev.activation_bytes + ev.buffer_bytes;
                        peak = peak.max(level);
                    }
                    m = ev.next;
                }
            }
            peak_at.push(peak);
        }
        let mine: Vec<usize> = (0..log.len()).filter(|&i| log[i].device == d).collect();
        for (k, &i) in mine.iter().enumerate() {
            let from = pos_of[&log[i].first_task];
            let to = mine.get(k + 1).map_or(stream.len(), |&j| pos_of[&log[j].first_task].max(from + 1));
            out[i] = peak_at[from..to].iter().copied().fold(0.0, f64::max);
        }
    }
    out
}

/// Where the optimizer step of a stage's parameters runs, as fractions of the stage's
/// parameters (they sum to 1).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Split {
    /// On the device, with their optimizer states (GPU Adam).
    pub device: f64,
    /// Chunk on the device, optimizer states on the host: gradients go down, CPU Adam,
    /// parameters come back.
    pub resident_host_states: f64,
    /// Chunk on the host: CPU Adam in place.
    pub host: f64,
}

/// One stage's chunk placement in steady state.
#[derive(Clone, Debug)]
pub(super) struct StagePlacement {
    /// Per access (in the order of the warm-up log): the moves before it, as (to device,
    /// bytes on one device).
    pub moves: Vec<Vec<(bool, f64)>>,
    /// Bytes of chunks resident when the iteration starts (and ends).
    pub resident_bytes: f64,
    /// Bytes of all chunks on one device's shard.
    pub total_bytes: f64,
    /// Fewest bytes of chunks resident at any step (the rest is in host memory).
    pub min_resident_bytes: f64,
    pub chunk_elems: u64,
    pub chunks: usize,
    pub split: Split,
    /// Optimizer-state bytes kept on the device.
    pub device_state_bytes: f64,
    pub feasible: bool,
}

/// What [`place_stage`] needs besides the accesses.
pub(super) struct StageInput {
    pub eviction: Eviction,
    pub budget_bytes: Option<f64>,
    /// The device's memory.
    pub hbm_bytes: f64,
    /// Bytes per parameter: low-precision weights (the chunk; gradients reuse it) and
    /// optimizer states.
    pub weight_bytes: f64,
    pub state_bytes: f64,
    /// Data-parallel degree the chunks are sharded over.
    pub shards: u32,
    /// Chunk-size search step (the hidden size).
    pub interval: u64,
    /// Split each transformer layer into its four weight matrices.
    pub split_layers: bool,
    /// Non-model bytes that stay on the device all iteration (buffers, frozen weights).
    pub static_non_model: f64,
}

/// `search_range` of the chunk-size search: 32 Mi elements, Colossal-AI's default.
pub const SEARCH_RANGE: u64 = 32 << 20;

/// Pack, place and split one stage's parameters. `accesses` are the stage's unit accesses in
/// program order with their warm-up non-model bytes.
pub(super) fn place_stage(accesses: &[(UnitAccess, f64)], inp: &StageInput) -> StagePlacement {
    // Tensors in first-use order: each unit once, a transformer layer as its four matrices
    // (QKV 3h², projection h², the MLP's 4h² twice; biases and norms ride along).
    let mut units: Vec<i32> = Vec::new();
    let mut tensors: Vec<u64> = Vec::new();
    let mut tensor_unit: Vec<usize> = Vec::new();
    for (a, _) in accesses {
        if units.contains(&a.unit) {
            continue;
        }
        units.push(a.unit);
        let shares: &[f64] =
            if inp.split_layers && a.unit >= 0 { &[3.0 / 12.0, 1.0 / 12.0, 4.0 / 12.0, 4.0 / 12.0] } else { &[1.0] };
        for s in shares {
            tensors.push((a.params * s).round() as u64);
            tensor_unit.push(units.len() - 1);
        }
    }
    let search =
        ChunkSearch { interval: inp.interval.max(1), search_range: SEARCH_RANGE, dp_lcm: inp.shards.max(1) as u64 };
    let chunk_elems = gemini::search_chunk_size(&tensors, &search);
    let packed = gemini::pack(&tensors, chunk_elems);
    let n = packed.len();
    let mut unit_chunks: Vec<Vec<usize>> = vec![Vec::new(); units.len()];
    for (c, ch) in packed.iter().enumerate() {
        for &t in &ch.tensors {
            let u = tensor_unit[t];
            if unit_chunks[u].last() != Some(&c) {
                unit_chunks[u].push(c);
            }
        }
    }
    let shard = inp.shards.max(1) as f64;
    let sizes: Vec<f64> = packed.iter().map(|c| c.capacity.max(1) as f64 * inp.weight_bytes / shard).collect();
    let bytes_of = |c: usize| sizes[c];
    let (cap, nm_scale) = match inp.budget_bytes {
        // `const`: a fixed budget for model data, whatever else the device holds.
        Some(b) => (b, 0.0),
        None => (inp.hbm_bytes * STEADY_CUDA_CAP_RATIO, 1.0),
    };
    let mut trace = Vec::new();
    let mut access_of_step = Vec::new();
    let mut raw_non_model = Vec::new();
    for (i, (a, nm)) in accesses.iter().enumerate() {
        let u = units.iter().position(|&x| x == a.unit).expect("unit registered");
        for &c in &unit_chunks[u] {
            trace.push(Access { chunk: c, non_model_bytes: nm_scale * (inp.static_non_model + nm) });
            raw_non_model.push(inp.static_non_model + nm);
            access_of_step.push(i);
        }
    }
    let first = gemini::place_sized(&trace, &sizes, cap, &[], inp.eviction);
    let start = gemini::resident_after(n, &[], &first.moves);
    let steady = gemini::place_sized(&trace, &sizes, cap, &start, inp.eviction);
    let end = gemini::resident_after(n, &start, &steady.moves);

    let mut moves = vec![Vec::new(); accesses.len()];
    let mut resident: Vec<bool> = (0..n).map(|c| start.contains(&c)).collect();
    let start_bytes: f64 = start.iter().map(|&c| bytes_of(c)).sum();
    let mut level = start_bytes;
    let mut min_level = level;
    for &Move { step, chunk, to_device } in &steady.moves {
        moves[access_of_step[step]].push((to_device, bytes_of(chunk)));
        resident[chunk] = to_device;
        level += if to_device { bytes_of(chunk) } else { -bytes_of(chunk) };
        min_level = min_level.min(level);
    }
    // Hybrid Adam: chunks resident at the end keep their optimizer states on the device while
    // the room the placement left allows; the rest step on the host.
    // (Under `const` the budget bounds chunks only: the margin is what the device has left
    // beside the chunks' and the non-model peaks.)
    let mut margin = match inp.budget_bytes {
        None => cap - steady.peak_device_bytes,
        Some(_) => {
            let non_model = raw_non_model.iter().copied().fold(0.0, f64::max);
            inp.hbm_bytes * STEADY_CUDA_CAP_RATIO - steady.peak_device_bytes - non_model
        }
    };
    let used_total: u64 = packed.iter().map(|c| c.used).sum::<u64>().max(1);
    let mut used = [0u64; 3];
    let mut device_state_bytes = 0.0;
    for (c, ch) in packed.iter().enumerate() {
        if end.contains(&c) {
            let states = ch.used as f64 * inp.state_bytes / shard;
            if states <= margin {
                margin -= states;
                device_state_bytes += states;
                used[0] += ch.used;
            } else {
                used[1] += ch.used;
            }
        } else {
            used[2] += ch.used;
        }
    }
    let share = |u: u64| u as f64 / used_total as f64;
    let split = Split { device: share(used[0]), resident_host_states: share(used[1]), host: share(used[2]) };
    StagePlacement {
        moves,
        resident_bytes: start_bytes,
        total_bytes: (0..n).map(bytes_of).sum(),
        min_resident_bytes: min_level,
        chunk_elems,
        chunks: n,
        split,
        device_state_bytes,
        feasible: steady.feasible,
    }
}
