//! Pipeline schedules: the per-device order of forward and backward passes.
//!
//! A pipeline-parallel training step splits the model into `stages`
//! consecutive pieces, one per device, and the batch into `micro_batches`
//! micro-batches. Every micro-batch runs a forward pass through every piece,
//! first to last, and then a backward pass through every piece, last to
//! first. A *schedule* decides, for each device, the order in which it runs
//! the passes it owns. The order is all a schedule is: this module says
//! nothing about time, cost or communication. Those belong to the lowering,
//! which turns each device's order into simulator work and lets the
//! dependencies between devices decide when each pass can start.
//!
//! With the interleaved schedule each device holds `virtual_stages` (v)
//! pieces ("model chunks") instead of one, so the model has `stages * v`
//! chunks. Chunk `c` (the *global* chunk index, `0..stages * v`) lives on
//! device `c % stages`, and is the `c / stages`-th chunk of that device. For
//! every other schedule v = 1 and chunk index == stage index.
//!
//! Below is the 1F1B schedule ([`ScheduleKind::OneFOneB`]) for 4 stages and
//! 8 micro-batches, as executed with every pass taking one time unit, free
//! communication, and each device running its order as early as the
//! cross-device dependencies allow (`F3` is micro-batch 3's forward, `B3` its
//! backward, `.` idle). Stage 0 runs 3 warm-up forwards, stage 3 none; in the
//! steady state every device alternates one forward and one backward, which
//! caps the number of micro-batches whose activations a device holds at
//! `stages - stage` instead of GPipe's `micro_batches`. The 6 idle slots per
//! device out of 22 are the pipeline bubble, `(p-1)/(m+p-1) = 3/11`
//! ([`bubble_fraction`]).
//!
//! ```text
//! time     0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21
//! stage 0 F0 F1 F2 F3  .  .  . B0 F4 B1 F5 B2 F6 B3 F7 B4  . B5  . B6  . B7
//! stage 1  . F0 F1 F2  .  . B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5  . B6  . B7  .
//! stage 2  .  . F0 F1  . B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6  . B7  .  .
//! stage 3  .  .  . F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7  .  .  .
//! ```
//!
//! Where to start: [`stage_order`] (one device) or [`table`] (all devices)
//! generate the orders; [`ScheduleShape`] carries the sizes and
//! [`ScheduleError`] says which shapes are allowed. [`max_in_flight`],
//! [`in_flight_bound`] and [`warmup_forwards`] describe the activation
//! memory an order needs, and [`bubble_fraction`] is the textbook idle
//! fraction the simulator should reproduce under uniform costs. The unit
//! tests (`tests.rs`) contain a small reference executor of a table.

use std::collections::HashSet;
use std::fmt;

/// Which pipeline schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    /// GPipe: every forward (micro-batch 0 first), then every backward,
    /// also in micro-batch order. In-order backwards (rather than reverse)
    /// keep the backward sequence identical to 1F1B's, so the two schedules
    /// differ only in where the forwards go, and activations are released
    /// first-in first-out; under uniform costs the makespan is the same
    /// either way.
    GPipe,
    /// PipeDream-Flush / Megatron-LM's non-interleaved 1F1B: on `stage`,
    /// `min(stages - stage - 1, m)` warm-up forwards, then alternate one
    /// forward and one backward, then the remaining backwards (cool-down).
    OneFOneB,
    /// Megatron-LM's interleaved 1F1B with `virtual_stages` model chunks per
    /// device. Needs `micro_batches % stages == 0`. See [`stage_order`].
    Interleaved,
    /// PipeDream-2BW. Within one iteration of `m` micro-batches each device
    /// runs the same op order as 1F1B; what differs (no flush, double
    /// buffered weights) is the lowering's concern.
    TwoBW,
    /// PipeDream-Flush, an alias of the 1F1B order.
    Flush,
}

impl ScheduleKind {
    /// Every kind, in declaration order.
    pub const ALL: [ScheduleKind; 5] = [
        ScheduleKind::GPipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::Interleaved,
        ScheduleKind::TwoBW,
        ScheduleKind::Flush,
    ];

    /// Whether this kind's per-device order is the 1F1B order.
    fn is_one_f_one_b(self) -> bool {
        matches!(self, ScheduleKind::OneFOneB | ScheduleKind::TwoBW | ScheduleKind::Flush)
    }
}

/// Forward or backward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    Forward,
    Backward,
}

/// One entry of a device's op order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Step {
    /// Micro-batch index, `0..micro_batches`.
    pub micro_batch: u32,
    /// Model chunk index in `0..stages * virtual_stages`: the GLOBAL
    /// virtual-stage index (chunk `c` lives on device `c % stages`). Without
    /// interleaving this equals the stage index.
    pub chunk: u32,
    pub pass: Pass,
}

/// The sizes a schedule is generated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleShape {
    /// Pipeline stages (devices), `p >= 1`.
    pub stages: u32,
    /// Micro-batches per step, `m >= 1`.
    pub micro_batches: u32,
    /// Model chunks per device, `v >= 1`; 1 unless [`ScheduleKind::Interleaved`].
    pub virtual_stages: u32,
}

impl ScheduleShape {
    /// Total number of model chunks, `stages * virtual_stages`.
    pub fn chunks(&self) -> u64 {
        u64::from(self.stages) * u64::from(self.virtual_stages)
    }
}

/// Why a schedule cannot be generated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleError {
    /// `stages` was 0.
    ZeroStages,
    /// `micro_batches` was 0.
    ZeroMicroBatches,
    /// `virtual_stages` was 0.
    ZeroVirtualStages,
    /// `virtual_stages > 1` with a kind other than `Interleaved`.
    VirtualStagesNeedInterleaved { kind: ScheduleKind, virtual_stages: u32 },
    /// `Interleaved` with `micro_batches` not a multiple of `stages`.
    MicroBatchesNotMultipleOfStages { micro_batches: u32, stages: u32 },
    /// `stage >= stages`.
    StageOutOfRange { stage: u32, stages: u32 },
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::ZeroStages => {
                write!(f, "pipeline stages is 0; it must be at least 1")
            }
            ScheduleError::ZeroMicroBatches => {
                write!(f, "micro-batches is 0; it must be at least 1")
            }
            ScheduleError::ZeroVirtualStages => {
                write!(f, "virtual stages is 0; it must be at least 1 (1 means no interleaving)")
            }
            ScheduleError::VirtualStagesNeedInterleaved { kind, virtual_stages } => write!(
                f,
                "virtual stages is {virtual_stages} with the {kind:?} schedule; \
                 only the Interleaved schedule allows more than 1"
            ),
            ScheduleError::MicroBatchesNotMultipleOfStages { micro_batches, stages } => {
                write!(
                    f,
                    "micro-batches is {micro_batches} with {stages} pipeline stages; \
                     the Interleaved schedule needs micro-batches to be a multiple of \
                     the stage count (Megatron-LM's rule), e.g. "
                )?;
                let below = u64::from(*micro_batches) / u64::from(*stages).max(1) * u64::from(*stages);
                let above = below + u64::from(*stages);
                if below > 0 { write!(f, "{below} or {above}") } else { write!(f, "{above}") }
            }
            ScheduleError::StageOutOfRange { stage, stages } => {
                write!(f, "stage {stage} does not exist; with {stages} pipeline stages it must be in 0..{stages}")
            }
        }
    }
}

impl std::error::Error for ScheduleError {}

/// Checks that `shape` is allowed for `kind` (see [`ScheduleError`]).
pub fn validate(kind: ScheduleKind, shape: ScheduleShape) -> Result<(), ScheduleError> {
    if shape.stages == 0 {
        return Err(ScheduleError::ZeroStages);
    }
    if shape.micro_batches == 0 {
        return Err(ScheduleError::ZeroMicroBatches);
    }
    if shape.virtual_stages == 0 {
        return Err(ScheduleError::ZeroVirtualStages);
    }
    if kind != ScheduleKind::Interleaved && shape.virtual_stages != 1 {
        return Err(ScheduleError::VirtualStagesNeedInterleaved { kind, virtual_stages: shape.virtual_stages });
    }
    if kind == ScheduleKind::Interleaved && !shape.micro_batches.is_multiple_of(shape.stages) {
        return Err(ScheduleError::MicroBatchesNotMultipleOfStages {
            micro_batches: shape.micro_batches,
            stages: shape.stages,
        });
    }
    Ok(())
}

/// The op order of one pipeline stage (device) under `kind`.
///
/// The order holds exactly one `Forward` and one `Backward` for every
/// micro-batch and every chunk the device owns (`2 * m * v` steps).
///
/// Interleaved follows Megatron-LM's `get_schedule_table` and
/// `forward_backward_pipelining_with_interleaving`: micro-batches are taken
/// in groups of `stages`; the k-th forward of a device is, within group
/// `g = k / (stages * v)` and `r = k % (stages * v)`, micro-batch
/// `g * stages + r % stages` on the device's local chunk `r / stages`; the
/// k-th backward is the same micro-batch on local chunk `v - 1 - r / stages`
/// (chunks visited in reverse). The device runs [`warmup_forwards`]
/// forwards, then alternates forward k+W and backward k, then the remaining
/// backwards. With `virtual_stages == 1` the order is exactly 1F1B's
/// (Megatron dispatches to its non-interleaved schedule then; its
/// interleaved warm-up formula would double the warm-up for no benefit).
pub fn stage_order(kind: ScheduleKind, shape: ScheduleShape, stage: u32) -> Result<Vec<Step>, ScheduleError> {
    validate(kind, shape)?;
    if stage >= shape.stages {
        return Err(ScheduleError::StageOutOfRange { stage, stages: shape.stages });
    }
    let m = shape.micro_batches;
    let order = match kind {
        ScheduleKind::GPipe => {
            let mut order = Vec::with_capacity(2 * m as usize);
            order.extend((0..m).map(|mb| step(mb, stage, Pass::Forward)));
            order.extend((0..m).map(|mb| step(mb, stage, Pass::Backward)));
            order
        }
        ScheduleKind::OneFOneB | ScheduleKind::TwoBW | ScheduleKind::Flush => {
            let forwards: Vec<Step> = (0..m).map(|mb| step(mb, stage, Pass::Forward)).collect();
            let backwards: Vec<Step> = (0..m).map(|mb| step(mb, stage, Pass::Backward)).collect();
            one_f_one_b(&forwards, &backwards, warmup_forwards(kind, shape, stage))
        }
        ScheduleKind::Interleaved => {
            let p = shape.stages;
            let v = shape.virtual_stages;
            let table = megatron_schedule_table(m, v, p);
            let global = |local: u32| local * p + stage;
            let forwards: Vec<Step> = table.iter().map(|&(mb, local)| step(mb, global(local), Pass::Forward)).collect();
            let backwards: Vec<Step> =
                table.iter().map(|&(mb, local)| step(mb, global(v - 1 - local), Pass::Backward)).collect();
            one_f_one_b(&forwards, &backwards, warmup_forwards(kind, shape, stage))
        }
    };
    Ok(order)
}

/// Every stage's order (index = stage).
pub fn table(kind: ScheduleKind, shape: ScheduleShape) -> Result<Vec<Vec<Step>>, ScheduleError> {
    validate(kind, shape)?;
    (0..shape.stages).map(|stage| stage_order(kind, shape, stage)).collect()
}

/// The largest number of `(micro_batch, chunk)` pairs whose forward has run
/// but whose backward has not, over `order` (the activation-memory bound of
/// one device, in units of one chunk's activations for one micro-batch).
///
/// Pairs are counted, not micro-batches: with interleaving a micro-batch
/// can hold activations on several of the device's chunks at once, and each
/// costs memory. Without interleaving a device has one chunk, so the count
/// is in micro-batches. A backward whose forward has not run (a malformed
/// order) is ignored.
pub fn max_in_flight(order: &[Step]) -> u32 {
    let mut live: HashSet<(u32, u32)> = HashSet::new();
    let mut peak = 0u32;
    for s in order {
        match s.pass {
            Pass::Forward => {
                live.insert((s.micro_batch, s.chunk));
                peak = peak.max(u32::try_from(live.len()).unwrap_or(u32::MAX));
            }
            Pass::Backward => {
                live.remove(&(s.micro_batch, s.chunk));
            }
        }
    }
    peak
}

/// The schedule's theoretical bound on in-flight forward activations
/// (`(micro_batch, chunk)` pairs, as [`max_in_flight`] counts them) on
/// `stage`: GPipe `m`; 1F1B, 2BW and Flush `min(stages - stage, m)`;
/// interleaved `min(warmup_forwards + 1, m * v)`. The orders from
/// [`stage_order`] reach it exactly.
///
/// Like [`warmup_forwards`], the shape is not validated; zero sizes give 0.
pub fn in_flight_bound(kind: ScheduleKind, shape: ScheduleShape, stage: u32) -> u32 {
    let m = u64::from(shape.micro_batches);
    let bound = match kind {
        ScheduleKind::GPipe => m,
        ScheduleKind::OneFOneB | ScheduleKind::TwoBW | ScheduleKind::Flush => {
            u64::from(shape.stages.saturating_sub(stage)).min(m)
        }
        ScheduleKind::Interleaved => {
            let total = m * u64::from(shape.virtual_stages);
            (u64::from(warmup_forwards(kind, shape, stage)) + 1).min(total)
        }
    };
    saturate(bound)
}

/// Warm-up forward count before the first backward on `stage`: the
/// forwards a device runs before it starts alternating. Its steady state
/// opens with one more forward, so `min(warmup + 1, m * v)` forwards precede
/// the first backward in the order (for GPipe, all `m`).
///
/// GPipe: `m`. 1F1B, 2BW, Flush: `min(stages - stage - 1, m)`.
/// Interleaved (Megatron-LM): `min((stages - stage - 1) * 2 + (v - 1) *
/// stages, m * v)`, except that `v == 1` gives the 1F1B count (see
/// [`stage_order`]). Current Megatron-LM uses this formula for every shape;
/// older releases ran all forwards first when `m == stages`, which this
/// module does not copy.
///
/// The shape is not validated (use [`validate`]); a stage past the end
/// counts as the last.
pub fn warmup_forwards(kind: ScheduleKind, shape: ScheduleShape, stage: u32) -> u32 {
    let p = u64::from(shape.stages);
    let m = u64::from(shape.micro_batches);
    let v = u64::from(shape.virtual_stages);
    let after = p.saturating_sub(u64::from(stage) + 1);
    let warmup = if kind == ScheduleKind::GPipe {
        m
    } else if kind.is_one_f_one_b() || v <= 1 {
        after.min(m)
    } else {
        (after * 2 + (v - 1) * p).min(m * v)
    };
    saturate(warmup)
}

/// Analytical pipeline bubble fraction (idle time over total device time)
/// with uniform stages, equal forward and backward costs and free
/// communication.
///
/// GPipe, 1F1B, 2BW, Flush: `(p-1) / (m + p - 1)`.
/// Interleaved: `(p-1) / (v*m + p - 1)`. Megatron-LM quotes the bubble as
/// `(p-1) / (v*m)` of the ideal compute time; normalising by the total
/// (ideal + bubble) instead gives this, which is comparable with the other
/// kinds and equals 1F1B's at `v = 1`.
///
/// The unit tests execute every order [`table`] generates (stages 1..=8,
/// micro-batches 1..=24, v 1..=4, plus random larger shapes) with unit-cost
/// chunk ops and find exactly this idle fraction for every kind,
/// interleaved included.
///
/// Sizes below 1 count as 1 (the shape is not validated); a non-interleaved
/// kind ignores `virtual_stages`.
pub fn bubble_fraction(kind: ScheduleKind, shape: ScheduleShape) -> f64 {
    let p = f64::from(shape.stages.max(1));
    let m = f64::from(shape.micro_batches.max(1));
    let v = match kind {
        ScheduleKind::Interleaved => f64::from(shape.virtual_stages.max(1)),
        _ => 1.0,
    };
    (p - 1.0) / (v * m + p - 1.0)
}

fn step(micro_batch: u32, chunk: u32, pass: Pass) -> Step {
    Step { micro_batch, chunk, pass }
}

fn saturate(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// The 1F1B skeleton shared by the non-interleaved and interleaved
/// schedules: `warmup` forwards, then forward `k + warmup` followed by
/// backward `k` while forwards remain, then the remaining backwards.
fn one_f_one_b(forwards: &[Step], backwards: &[Step], warmup: u32) -> Vec<Step> {
    debug_assert_eq!(forwards.len(), backwards.len());
    let total = forwards.len();
    let warmup = (warmup as usize).min(total);
    let mut order = Vec::with_capacity(2 * total);
    order.extend_from_slice(&forwards[..warmup]);
    for k in 0..total - warmup {
        order.push(forwards[warmup + k]);
        order.push(backwards[k]);
    }
    order.extend_from_slice(&backwards[total - warmup..]);
    order
}

/// Megatron-LM's `get_schedule_table`: the `(micro_batch, local chunk)` of
/// each virtual micro-batch, in forward order. Micro-batches go in groups
/// of `group`; each group runs through chunk 0, then chunk 1, and so on; a
/// short last group takes whatever micro-batches are left.
fn megatron_schedule_table(micro_batches: u32, chunks: u32, group: u32) -> Vec<(u32, u32)> {
    let mut table = Vec::with_capacity(micro_batches as usize * chunks as usize);
    let mut first = 0;
    while first < micro_batches {
        let end = first.saturating_add(group).min(micro_batches);
        for chunk in 0..chunks {
            for mb in first..end {
                table.push((mb, chunk));
            }
        }
        first = end;
    }
    table
}

#[cfg(test)]
mod tests;
