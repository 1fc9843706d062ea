//! Perfetto's native trace format (protobuf `Trace` of `TracePacket`s with track events),
//! about a third the size of the same trace as JSON and read by ui.perfetto.dev and
//! trace_processor directly.
//!
//! Only the fields used are declared; their numbers are those of Perfetto's
//! `protos/perfetto/trace/trace_packet.proto`, `track_event/track_event.proto` and
//! `track_event/track_descriptor.proto` (Apache-2.0; field numbers only).
//!
//! Layout (as the JSON trace, see [`super::trace`]): one process track per simulated device,
//! one thread track per stream it used, two counter tracks for its dynamic memory; an
//! `interconnect` process with one track per link lane. Spans on one stream never overlap
//! (a stream is an in-order queue); flows on one link may, so each link's flows are laid out
//! on as many lanes as overlap at once. Event names are interned once in the first packet.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message;

use super::timeline::*;
use super::trace::TraceNames;

#[derive(Clone, PartialEq, Message)]
struct TracePacket {
    #[prost(uint64, optional, tag = "8")]
    timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "10")]
    trusted_packet_sequence_id: Option<u32>,
    #[prost(message, optional, tag = "11")]
    track_event: Option<TrackEvent>,
    #[prost(message, optional, tag = "12")]
    interned_data: Option<InternedData>,
    #[prost(uint32, optional, tag = "13")]
    sequence_flags: Option<u32>,
    #[prost(message, optional, tag = "60")]
    track_descriptor: Option<TrackDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
struct TrackEvent {
    /// 1 slice begin, 2 slice end, 4 counter.
    #[prost(int32, optional, tag = "9")]
    kind: Option<i32>,
    #[prost(uint64, optional, tag = "10")]
    name_iid: Option<u64>,
    #[prost(uint64, optional, tag = "11")]
    track_uuid: Option<u64>,
    #[prost(double, optional, tag = "44")]
    double_counter_value: Option<f64>,
}

#[derive(Clone, PartialEq, Message)]
struct TrackDescriptor {
    #[prost(uint64, optional, tag = "1")]
    uuid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    name: Option<String>,
    #[prost(message, optional, tag = "3")]
    process: Option<ProcessDescriptor>,
    #[prost(uint64, optional, tag = "5")]
    parent_uuid: Option<u64>,
    #[prost(message, optional, tag = "8")]
    counter: Option<CounterDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
struct ProcessDescriptor {
    #[prost(int32, optional, tag = "1")]
    pid: Option<i32>,
    #[prost(string, optional, tag = "6")]
    process_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct CounterDescriptor {}

#[derive(Clone, PartialEq, Message)]
struct InternedData {
    #[prost(message, repeated, tag = "2")]
    event_names: Vec<EventName>,
}

#[derive(Clone, PartialEq, Message)]
struct EventName {
    #[prost(uint64, optional, tag = "1")]
    iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    name: Option<String>,
}

const SEQUENCE: u32 = 1;
const INCREMENTAL_STATE_CLEARED: u32 = 1;
const NEEDS_INCREMENTAL_STATE: u32 = 2;
const SLICE_BEGIN: i32 = 1;
const SLICE_END: i32 = 2;
const COUNTER: i32 = 4;

/// Track ids: a device's process is `(d + 1) << 4`, its streams and counters the next ids.
fn device_uuid(d: u32) -> u64 {
    (d as u64 + 1) << 4
}
fn stream_uuid(d: u32, s: StreamKind) -> u64 {
    device_uuid(d) + 1 + s.index() as u64
}
fn counter_uuid(d: u32, which: u64) -> u64 {
    device_uuid(d) + 8 + which
}
const INTERCONNECT_UUID: u64 = 1;
fn lane_uuid(lane: u64) -> u64 {
    (1 << 40) + lane
}

/// Appends one packet as field 1 of `Trace`.
fn put(out: &mut Vec<u8>, p: &TracePacket) {
    out.push(0x0a);
    p.encode_length_delimited(out).expect("a Vec grows as needed");
}

fn track(out: &mut Vec<u8>, d: TrackDescriptor) {
    put(
        out,
        &TracePacket { trusted_packet_sequence_id: Some(SEQUENCE), track_descriptor: Some(d), ..Default::default() },
    );
}

fn event(out: &mut Vec<u8>, ts: u64, e: TrackEvent) {
    put(
        out,
        &TracePacket {
            timestamp: Some(ts),
            trusted_packet_sequence_id: Some(SEQUENCE),
            track_event: Some(e),
            sequence_flags: Some(NEEDS_INCREMENTAL_STATE),
            ..Default::default()
        },
    );
}

fn span_name(t: &Timeline, s: &Span) -> String {
    let mut n = match t.labels.get(s.label as usize) {
        Some(l) if l.layer >= 0 => format!("L{} {} {}", l.layer, l.op, l.phase.short()),
        Some(l) => format!("{} {}", l.op, l.phase.short()),
        None => format!("label{}", s.label),
    };
    if s.micro_batch != u32::MAX {
        n.push_str(&format!(" mb{}", s.micro_batch));
    }
    n
}

/// The trace of `t` in Perfetto's protobuf format.
pub fn perfetto_trace(t: &Timeline, names: &TraceNames) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 40 * t.spans.len() + 60 * t.flows.len() + 24 * t.memory.len());
    // Interned names, in first-use order (deterministic).
    let mut iids: BTreeMap<String, u64> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut iid = |name: String| -> u64 {
        let next = iids.len() as u64 + 1;
        *iids.entry(name.clone()).or_insert_with(|| {
            order.push(name);
            next
        })
    };
    let span_iids: Vec<u64> = t.spans.iter().map(|s| iid(span_name(t, s))).collect();
    let flow_iids: Vec<u64> =
        t.flows.iter().map(|f| iid(format!("{}->{} {:.0}B", f.source, f.target, f.bytes.max(0.0)))).collect();
    let memory_iid = iid("memory".to_string());
    put(
        &mut out,
        &TracePacket {
            trusted_packet_sequence_id: Some(SEQUENCE),
            sequence_flags: Some(INCREMENTAL_STATE_CLEARED),
            interned_data: Some(InternedData {
                event_names: order
                    .into_iter()
                    .enumerate()
                    .map(|(i, name)| EventName { iid: Some(i as u64 + 1), name: Some(name) })
                    .collect(),
            }),
            ..Default::default()
        },
    );

    // Tracks: devices, their streams and memory counters.
    let mut devices: BTreeSet<u32> = t.devices.iter().copied().collect();
    let streams: BTreeSet<(u32, StreamKind)> = t.spans.iter().map(|s| (s.device, s.stream)).collect();
    devices.extend(streams.iter().map(|&(d, _)| d));
    devices.extend(t.memory.iter().map(|m| m.device));
    let stage: BTreeMap<u32, u32> = t.devices.iter().copied().zip(t.stages.iter().copied()).collect();
    for &d in &devices {
        let name = match stage.get(&d) {
            Some(s) => format!("{} (stage {s})", (names.device_name)(d)),
            None => (names.device_name)(d),
        };
        track(
            &mut out,
            TrackDescriptor {
                uuid: Some(device_uuid(d)),
                process: Some(ProcessDescriptor { pid: Some(d as i32 + 1), process_name: Some(name) }),
                ..Default::default()
            },
        );
    }
    for &(d, s) in &streams {
        track(
            &mut out,
            TrackDescriptor {
                uuid: Some(stream_uuid(d, s)),
                name: Some(s.name().to_string()),
                parent_uuid: Some(device_uuid(d)),
                ..Default::default()
            },
        );
    }
    let memory_devices: BTreeSet<u32> = t.memory.iter().map(|m| m.device).collect();
    for &d in &memory_devices {
        for (which, name) in [(0, "activations bytes"), (1, "moved weights bytes")] {
            track(
                &mut out,
                TrackDescriptor {
                    uuid: Some(counter_uuid(d, which)),
                    name: Some(name.to_string()),
                    parent_uuid: Some(device_uuid(d)),
                    counter: Some(CounterDescriptor {}),
                    ..Default::default()
                },
            );
        }
    }

    // Flows: per link, lanes of non-overlapping flows (first lane free at the flow's start).
    let mut lanes: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut flow_lane: Vec<Vec<(u32, usize)>> = Vec::with_capacity(t.flows.len());
    let mut order: Vec<usize> = (0..t.flows.len()).collect();
    order.sort_by_key(|&i| (t.flows[i].start_ns, i));
    flow_lane.resize(t.flows.len(), Vec::new());
    for i in order {
        let f = &t.flows[i];
        let [a, b] = f.links;
        for l in [a, b].into_iter().filter(|&l| l != u32::MAX).collect::<BTreeSet<_>>() {
            let ends = lanes.entry(l).or_default();
            let k = match ends.iter().position(|&e| e <= f.start_ns) {
                Some(k) => k,
                None => {
                    ends.push(0);
                    ends.len() - 1
                }
            };
            ends[k] = f.end_ns.max(f.start_ns);
            flow_lane[i].push((l, k));
        }
    }
    let mut lane_ids: BTreeMap<(u32, usize), u64> = BTreeMap::new();
    for (&l, ends) in &lanes {
        for k in 0..ends.len() {
            let id = lane_ids.len() as u64;
            lane_ids.insert((l, k), id);
        }
    }
    if !lane_ids.is_empty() {
        track(
            &mut out,
            TrackDescriptor {
                uuid: Some(INTERCONNECT_UUID),
                process: Some(ProcessDescriptor {
                    pid: Some(devices.last().map_or(0, |&d| d as i32) + 2),
                    process_name: Some("interconnect".into()),
                }),
                ..Default::default()
            },
        );
        for (&(l, k), &id) in &lane_ids {
            let name = if k == 0 { (names.link_name)(l) } else { format!("{} ({})", (names.link_name)(l), k + 1) };
            track(
                &mut out,
                TrackDescriptor {
                    uuid: Some(lane_uuid(id)),
                    name: Some(name),
                    parent_uuid: Some(INTERCONNECT_UUID),
                    ..Default::default()
                },
            );
        }
    }

    // Events.
    let slice = |out: &mut Vec<u8>, track: u64, name: u64, start: u64, end: u64| {
        let e =
            |kind, name_iid| TrackEvent { kind: Some(kind), name_iid, track_uuid: Some(track), ..Default::default() };
        event(out, start, e(SLICE_BEGIN, Some(name)));
        event(out, end.max(start), e(SLICE_END, None));
    };
    for (s, &name) in t.spans.iter().zip(&span_iids) {
        slice(&mut out, stream_uuid(s.device, s.stream), name, s.start_ns, s.end_ns);
    }
    for (i, f) in t.flows.iter().enumerate() {
        for &(l, k) in &flow_lane[i] {
            slice(&mut out, lane_uuid(lane_ids[&(l, k)]), flow_iids[i], f.start_ns, f.end_ns);
        }
    }
    for m in &t.memory {
        for (which, value) in [(0, m.activations), (1, m.moved_weights)] {
            let v = if value.is_finite() { value } else { 0.0 };
            event(
                &mut out,
                m.time_ns,
                TrackEvent {
                    kind: Some(COUNTER),
                    name_iid: Some(memory_iid),
                    track_uuid: Some(counter_uuid(m.device, which)),
                    double_counter_value: Some(v),
                },
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes the trace back with the same message types.
    fn packets(bytes: &[u8]) -> Vec<TracePacket> {
        #[derive(Clone, PartialEq, Message)]
        struct Trace {
            #[prost(message, repeated, tag = "1")]
            packet: Vec<TracePacket>,
        }
        Trace::decode(bytes).expect("a valid Trace message").packet
    }

    fn timeline() -> Timeline {
        let label = Label { op: "fc1", layer: 3, phase: Phase::Forward, chunk: 0 };
        let span = |device, start_ns, end_ns| Span {
            device,
            stream: StreamKind::Compute,
            start_ns,
            end_ns,
            label: 0,
            micro_batch: 1,
        };
        let flow =
            |start_ns, end_ns| FlowSpan { links: [5, u32::MAX], source: 0, target: 1, start_ns, end_ns, bytes: 8.0 };
        Timeline {
            labels: vec![label],
            spans: vec![span(0, 0, 100), span(1, 50, 150)],
            // Two flows overlap on link 5, a third follows the first.
            flows: vec![flow(0, 10), flow(5, 20), flow(12, 30)],
            memory: vec![MemorySample { device: 0, time_ns: 7, activations: 64.0, moved_weights: 0.0 }],
            devices: vec![0, 1],
            stages: vec![0, 1],
            ..Timeline::default()
        }
    }

    #[test]
    fn every_span_is_a_begin_and_an_end_on_its_stream_with_an_interned_name() {
        let t = timeline();
        let names = TraceNames { link_name: &|l| format!("link {l}"), device_name: &|d| format!("gpu {d}") };
        let p = packets(&perfetto_trace(&t, &names));
        let interned = p[0].interned_data.as_ref().expect("names first");
        let fc1 = interned.event_names.iter().find(|n| n.name.as_deref() == Some("L3 fc1 F mb1")).unwrap().iid;
        let on = |track: u64| -> Vec<(u64, i32)> {
            p.iter()
                .filter_map(|q| q.track_event.as_ref().map(|e| (q.timestamp.unwrap(), e)))
                .filter(|(_, e)| e.track_uuid == Some(track))
                .map(|(ts, e)| (ts, e.kind.unwrap()))
                .collect()
        };
        assert_eq!(on(stream_uuid(0, StreamKind::Compute)), vec![(0, SLICE_BEGIN), (100, SLICE_END)]);
        assert_eq!(on(stream_uuid(1, StreamKind::Compute)), vec![(50, SLICE_BEGIN), (150, SLICE_END)]);
        let begins = p.iter().filter_map(|q| q.track_event.as_ref()).filter(|e| e.kind == Some(SLICE_BEGIN));
        assert_eq!(begins.clone().filter(|e| e.name_iid == fc1).count(), 2);
        // Overlapping flows on one link get two lanes; the third reuses the first lane.
        let lanes: BTreeSet<u64> = p
            .iter()
            .filter_map(|q| q.track_descriptor.as_ref())
            .filter(|d| d.parent_uuid == Some(INTERCONNECT_UUID))
            .filter_map(|d| d.uuid)
            .collect();
        assert_eq!(lanes.len(), 2);
        let lane0 = on(*lanes.iter().next().unwrap());
        assert_eq!(lane0, vec![(0, SLICE_BEGIN), (10, SLICE_END), (12, SLICE_BEGIN), (30, SLICE_END)]);
        // The memory sample is a counter on device 0's activations track.
        let c: Vec<f64> = p
            .iter()
            .filter_map(|q| q.track_event.as_ref())
            .filter(|e| e.kind == Some(COUNTER) && e.track_uuid == Some(counter_uuid(0, 0)))
            .filter_map(|e| e.double_counter_value)
            .collect();
        assert_eq!(c, vec![64.0]);
        // Deterministic.
        assert_eq!(perfetto_trace(&t, &names), perfetto_trace(&t, &names));
    }
}
