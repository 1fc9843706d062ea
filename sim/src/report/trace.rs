//! Chrome trace-event JSON (the format Perfetto's UI and `chrome://tracing` open) from a
//! recorded [`Timeline`].
//!
//! Layout of the trace:
//! - one process per simulated device, named `device_name(device)`, with one thread per
//!   stream the device used (named [`StreamKind::name`]); every [`Span`] is a complete
//!   (`"ph":"X"`) event on its stream's thread, and every [`MemorySample`] a counter
//!   (`"ph":"C"`) event named `memory` on the device's process;
//! - one process named `interconnect`, with one thread per link used by any [`FlowSpan`]
//!   (named `link_name(link)`); every flow is an `X` event on each of its links' threads.
//!
//! Ids: the device `d` is pid `d + 1`; all thread ids are distinct from each other and from
//! every pid (Perfetto keys threads by tid alone, so a tid reused across processes would be
//! split into many tracks). Times are printed in microseconds with three decimals, which is
//! exact to the nanosecond.
//!
//! The output depends only on the input: metadata is sorted, events follow the order of the
//! timeline's vectors.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::timeline::*;

/// How to name devices and links in the trace.
pub struct TraceNames<'a> {
    pub link_name: &'a dyn Fn(u32) -> String,
    pub device_name: &'a dyn Fn(u32) -> String,
}

/// A link id that stands for "no link" in [`FlowSpan::links`]; skipped.
const NO_LINK: u32 = u32::MAX;

/// Thread ids per device: one per stream, with room to spare.
const TIDS_PER_DEVICE: u64 = StreamKind::ALL.len() as u64 + 1;

struct Ids {
    /// pid of the interconnect process; also one past the largest device pid.
    interconnect_pid: u64,
    /// First tid; larger than every pid.
    tid_base: u64,
    /// First tid of the links' threads.
    link_tid_base: u64,
}

impl Ids {
    fn new(max_device: Option<u32>) -> Ids {
        let devices = max_device.map_or(0, |d| d as u64 + 1);
        let interconnect_pid = devices + 1;
        let tid_base = interconnect_pid + 1;
        Ids { interconnect_pid, tid_base, link_tid_base: tid_base + devices * TIDS_PER_DEVICE }
    }
    fn device_pid(&self, device: u32) -> u64 {
        device as u64 + 1
    }
    fn stream_tid(&self, device: u32, stream: StreamKind) -> u64 {
        self.tid_base + device as u64 * TIDS_PER_DEVICE + stream.index() as u64
    }
    fn link_tid(&self, link: u32) -> u64 {
        self.link_tid_base + link as u64
    }
}

/// The trace of `t` as Chrome trace-event JSON (object form, `displayTimeUnit` ns).
pub fn chrome_trace(t: &Timeline, names: &TraceNames) -> String {
    // Collect, in sorted order, every device, stream and link the events refer to.
    let mut devices: BTreeSet<u32> = t.devices.iter().copied().collect();
    let mut streams: BTreeSet<(u32, StreamKind)> = BTreeSet::new();
    for s in &t.spans {
        devices.insert(s.device);
        streams.insert((s.device, s.stream));
    }
    for m in &t.memory {
        devices.insert(m.device);
    }
    let mut links: BTreeSet<u32> = BTreeSet::new();
    for f in &t.flows {
        for &l in flow_links(f) {
            links.insert(l);
        }
    }
    let ids = Ids::new(devices.last().copied());
    // Stage of each device, for the process labels.
    let stage: BTreeMap<u32, u32> = t.devices.iter().copied().zip(t.stages.iter().copied()).collect();

    let mut out = String::with_capacity(
        256 + 128 * (devices.len() + streams.len() + links.len())
            + 150 * t.spans.len()
            + 170 * 2 * t.flows.len()
            + 110 * t.memory.len(),
    );
    out.push_str("{\"traceEvents\":[\n");
    let mut w = Events { out: &mut out, first: true };

    // Metadata.
    for &d in &devices {
        let pid = ids.device_pid(d);
        let tid = pid;
        w.begin();
        w.raw("{\"name\":\"process_name\",\"ph\":\"M\"");
        w.ids(pid, tid);
        w.raw(",\"args\":{\"name\":");
        w.string(&(names.device_name)(d));
        w.raw("}}");
        w.begin();
        w.raw("{\"name\":\"process_sort_index\",\"ph\":\"M\"");
        w.ids(pid, tid);
        let _ = write!(w.out, ",\"args\":{{\"sort_index\":{d}}}}}");
        if let Some(s) = stage.get(&d) {
            w.begin();
            w.raw("{\"name\":\"process_labels\",\"ph\":\"M\"");
            w.ids(pid, tid);
            let _ = write!(w.out, ",\"args\":{{\"labels\":\"stage {s}\"}}}}");
        }
    }
    for &(d, s) in &streams {
        let pid = ids.device_pid(d);
        let tid = ids.stream_tid(d, s);
        w.begin();
        w.raw("{\"name\":\"thread_name\",\"ph\":\"M\"");
        w.ids(pid, tid);
        w.raw(",\"args\":{\"name\":");
        w.string(s.name());
        w.raw("}}");
        w.begin();
        w.raw("{\"name\":\"thread_sort_index\",\"ph\":\"M\"");
        w.ids(pid, tid);
        let _ = write!(w.out, ",\"args\":{{\"sort_index\":{}}}}}", s.index());
    }
    if !links.is_empty() {
        let pid = ids.interconnect_pid;
        w.begin();
        w.raw("{\"name\":\"process_name\",\"ph\":\"M\"");
        w.ids(pid, pid);
        w.raw(",\"args\":{\"name\":\"interconnect\"}}");
        w.begin();
        w.raw("{\"name\":\"process_sort_index\",\"ph\":\"M\"");
        w.ids(pid, pid);
        let _ = write!(w.out, ",\"args\":{{\"sort_index\":{}}}}}", pid);
        for &l in &links {
            let tid = ids.link_tid(l);
            w.begin();
            w.raw("{\"name\":\"thread_name\",\"ph\":\"M\"");
            w.ids(pid, tid);
            w.raw(",\"args\":{\"name\":");
            w.string(&(names.link_name)(l));
            w.raw("}}");
            w.begin();
            w.raw("{\"name\":\"thread_sort_index\",\"ph\":\"M\"");
            w.ids(pid, tid);
            let _ = write!(w.out, ",\"args\":{{\"sort_index\":{l}}}}}");
        }
    }

    // Spans.
    for s in &t.spans {
        let label = t.labels.get(s.label as usize);
        w.begin();
        w.raw("{\"name\":\"");
        match label {
            Some(l) => {
                if l.layer >= 0 {
                    let _ = write!(w.out, "L{} ", l.layer);
                }
                escape_into(w.out, l.op);
                w.raw(" ");
                w.raw(l.phase.short());
            }
            None => {
                let _ = write!(w.out, "label{}", s.label);
            }
        }
        if s.micro_batch != u32::MAX {
            let _ = write!(w.out, " mb{}", s.micro_batch);
        }
        w.raw("\",\"cat\":\"");
        w.raw(label.map_or("unknown", |l| l.phase.short()));
        w.raw("\",\"ph\":\"X\"");
        w.ids(ids.device_pid(s.device), ids.stream_tid(s.device, s.stream));
        w.times(s.start_ns, s.end_ns);
        w.raw(",\"args\":{");
        if let Some(l) = label {
            let _ = write!(w.out, "\"layer\":{},", l.layer);
        }
        if s.micro_batch != u32::MAX {
            let _ = write!(w.out, "\"micro_batch\":{},", s.micro_batch);
        } else {
            w.raw("\"micro_batch\":null,");
        }
        if let Some(l) = label {
            let _ = write!(w.out, "\"chunk\":{},\"phase\":\"{}\"", l.chunk, l.phase.short());
        } else {
            let _ = write!(w.out, "\"label\":{}", s.label);
        }
        w.raw("}}");
    }

    // Flows, once per link they cross.
    for f in &t.flows {
        for &l in flow_links(f) {
            w.begin();
            let _ = write!(
                w.out,
                "{{\"name\":\"{}->{} {:.0}B\",\"cat\":\"flow\",\"ph\":\"X\"",
                f.source,
                f.target,
                finite(f.bytes)
            );
            w.ids(ids.interconnect_pid, ids.link_tid(l));
            w.times(f.start_ns, f.end_ns);
            w.raw(",\"args\":{\"bytes\":");
            w.number(f.bytes);
            let _ = write!(w.out, ",\"source\":{},\"target\":{}}}}}", f.source, f.target);
        }
    }

    // Memory counters.
    for m in &t.memory {
        let pid = ids.device_pid(m.device);
        w.begin();
        w.raw("{\"name\":\"memory\",\"ph\":\"C\"");
        w.ids(pid, pid);
        w.raw(",\"ts\":");
        micros(w.out, m.time_ns);
        w.raw(",\"args\":{\"activations\":");
        w.number(finite(m.activations));
        w.raw(",\"moved_weights\":");
        w.number(finite(m.moved_weights));
        w.raw("}}");
    }

    out.push_str("\n],\"displayTimeUnit\":\"ns\"}\n");
    out
}

/// The distinct real links of a flow.
fn flow_links(f: &FlowSpan) -> &[u32] {
    let [a, b] = &f.links;
    match (*a != NO_LINK, *b != NO_LINK && b != a) {
        (true, true) => &f.links[..],
        (true, false) => std::slice::from_ref(a),
        (false, true) => std::slice::from_ref(b),
        (false, false) => &[],
    }
}

fn finite(x: f64) -> f64 {
    if x.is_finite() { x } else { 0.0 }
}

/// Writes `ns` as microseconds with three decimals (exact).
fn micros(out: &mut String, ns: u64) {
    let _ = write!(out, "{}.{:03}", ns / 1000, ns % 1000);
}

struct Events<'a> {
    out: &'a mut String,
    first: bool,
}

impl Events<'_> {
    /// Starts a new event (writes the separator).
    fn begin(&mut self) {
        if !self.first {
            self.out.push_str(",\n");
        }
        self.first = false;
    }
    fn raw(&mut self, s: &str) {
        self.out.push_str(s);
    }
    fn ids(&mut self, pid: u64, tid: u64) {
        let _ = write!(self.out, ",\"pid\":{pid},\"tid\":{tid}");
    }
    fn times(&mut self, start_ns: u64, end_ns: u64) {
        self.out.push_str(",\"ts\":");
        micros(self.out, start_ns);
        self.out.push_str(",\"dur\":");
        micros(self.out, end_ns.saturating_sub(start_ns));
    }
    /// A JSON number (`null` when not finite).
    fn number(&mut self, x: f64) {
        if x.is_finite() {
            let _ = write!(self.out, "{x}");
        } else {
            self.out.push_str("null");
        }
    }
    /// A quoted, escaped JSON string.
    fn string(&mut self, s: &str) {
        self.out.push('"');
        escape_into(self.out, s);
        self.out.push('"');
    }
}

/// Appends `s` escaped for the inside of a JSON string.
fn escape_into(out: &mut String, s: &str) {
    let bytes = s.as_bytes();
    let mut from = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x00..=0x1f | 0x7f => "",
            _ => continue,
        };
        // Escaped bytes are ASCII, so `from..i` is on char boundaries.
        out.push_str(&s[from..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{:04x}", b);
        } else {
            out.push_str(esc);
        }
        from = i + 1;
    }
    out.push_str(&s[from..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn label(op: &'static str, layer: i32, phase: Phase, chunk: u32) -> Label {
        Label { op, layer, phase, chunk }
    }

    fn span(device: u32, stream: StreamKind, start_ns: u64, end_ns: u64, label: u32, micro_batch: u32) -> Span {
        Span { device, stream, start_ns, end_ns, label, micro_batch }
    }

    fn timeline() -> Timeline {
        Timeline {
            labels: vec![
                label("qkv", 12, Phase::Forward, 0),
                label("fc1", 3, Phase::Backward, 1),
                label("adam", -1, Phase::Optimizer, 0),
                label("grad_allreduce", -1, Phase::Sync, 0),
            ],
            spans: vec![
                span(0, StreamKind::Compute, 1_234_567, 2_000_001, 0, 3),
                span(0, StreamKind::Compute, 2_000_001, 2_500_000, 1, 0),
                span(2, StreamKind::Compute, 5, 999, 2, u32::MAX),
                span(2, StreamKind::DataParallel, 1000, 4000, 3, u32::MAX),
                span(0, StreamKind::PipelineSend, 7, 8, 0, 1),
            ],
            flows: vec![
                FlowSpan { links: [4, 7], source: 0, target: 2, start_ns: 100, end_ns: 1100, bytes: 1048576.0 },
                FlowSpan { links: [7, 7], source: 2, target: 0, start_ns: 200, end_ns: 250, bytes: 12.0 },
            ],
            memory: vec![
                MemorySample { device: 0, time_ns: 0, activations: 1.0e9, moved_weights: 2048.0 },
                MemorySample { device: 2, time_ns: 1500, activations: 0.0, moved_weights: 0.5 },
            ],
            devices: vec![0, 2],
            stages: vec![0, 1],
            iteration_ns: 3_000_000,
            ..Timeline::default()
        }
    }

    fn names_default(t: &Timeline) -> String {
        let link = |l: u32| format!("link{l}");
        let dev = |d: u32| format!("gpu{d}");
        chrome_trace(t, &TraceNames { link_name: &link, device_name: &dev })
    }

    fn events(json: &str) -> Vec<Value> {
        let v: Value = serde_json::from_str(json).expect("valid JSON");
        assert_eq!(v["displayTimeUnit"], "ns");
        v["traceEvents"].as_array().expect("traceEvents array").clone()
    }

    fn by_ph<'a>(ev: &'a [Value], ph: &str) -> Vec<&'a Value> {
        ev.iter().filter(|e| e["ph"] == ph).collect()
    }

    fn meta<'a>(ev: &'a [Value], name: &str) -> Vec<&'a Value> {
        ev.iter().filter(|e| e["ph"] == "M" && e["name"] == name).collect()
    }

    #[test]
    fn counts_and_metadata() {
        let t = timeline();
        let ev = events(&names_default(&t));
        // 5 spans + 3 flow-on-link events (the second flow is on link 7 only).
        assert_eq!(by_ph(&ev, "X").len(), 5 + 3);
        assert_eq!(by_ph(&ev, "C").len(), 2);
        let procs: Vec<(u64, &str)> = meta(&ev, "process_name")
            .iter()
            .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(procs.len(), 3);
        assert_eq!(&procs[0..2], &[(1, "gpu0"), (3, "gpu2")]);
        assert_eq!(procs[2].1, "interconnect");
        let threads: Vec<(u64, &str)> = meta(&ev, "thread_name")
            .iter()
            .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(
            threads,
            vec![
                (1, "compute"),
                (1, "pp-send"),
                (3, "compute"),
                (3, "dp-comm"),
                (procs[2].0, "link4"),
                (procs[2].0, "link7"),
            ]
        );
        // Thread ids are unique, and distinct from every pid.
        let mut tids: Vec<u64> = meta(&ev, "thread_name").iter().map(|e| e["tid"].as_u64().unwrap()).collect();
        let pids: Vec<u64> = procs.iter().map(|p| p.0).collect();
        assert!(tids.iter().all(|t| !pids.contains(t)));
        tids.sort();
        tids.dedup();
        assert_eq!(tids.len(), 6);
        // Every X event lands on a named thread of its process.
        let named: BTreeSet<(u64, u64)> =
            meta(&ev, "thread_name").iter().map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap())).collect();
        for e in by_ph(&ev, "X") {
            assert!(named.contains(&(e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap())), "{e}");
        }
        let labels = meta(&ev, "process_labels");
        assert_eq!(labels.len(), 2);
        assert_eq!(labels[1]["args"]["labels"], "stage 1");
    }

    #[test]
    fn spans_names_times_args() {
        let t = timeline();
        let json = names_default(&t);
        // Exact to the nanosecond, as printed.
        assert!(json.contains("\"ts\":1234.567,\"dur\":765.434"), "{json}");
        let ev = events(&json);
        let x = by_ph(&ev, "X");
        let names: Vec<&str> = x.iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(&names[..5], &["L12 qkv F mb3", "L3 fc1 B mb0", "adam opt", "grad_allreduce sync", "L12 qkv F mb1"]);
        assert_eq!(x[0]["ts"].as_f64().unwrap(), 1234.567);
        assert_eq!(x[0]["dur"].as_f64().unwrap(), 765.434);
        assert_eq!(x[2]["ts"].as_f64().unwrap(), 0.005);
        assert_eq!(x[2]["dur"].as_f64().unwrap(), 0.994);
        assert_eq!(x[0]["cat"], "F");
        assert_eq!(x[1]["args"]["layer"], 3);
        assert_eq!(x[1]["args"]["micro_batch"], 0);
        assert_eq!(x[1]["args"]["chunk"], 1);
        assert_eq!(x[1]["args"]["phase"], "B");
        assert_eq!(x[2]["args"]["layer"], -1);
        assert!(x[2]["args"]["micro_batch"].is_null());
        assert_eq!(x[3]["cat"], "sync");
        // Flows.
        let flows: Vec<&&Value> = x.iter().filter(|e| e["cat"] == "flow").collect();
        assert_eq!(flows.len(), 3);
        assert_eq!(flows[0]["name"], "0->2 1048576B");
        assert_eq!(flows[0]["args"]["bytes"].as_f64().unwrap(), 1048576.0);
        assert_eq!(flows[0]["args"]["source"], 0);
        assert_eq!(flows[0]["args"]["target"], 2);
        assert_eq!(flows[0]["ts"].as_f64().unwrap(), 0.1);
        assert_eq!(flows[0]["dur"].as_f64().unwrap(), 1.0);
        assert_ne!(flows[0]["tid"], flows[1]["tid"]);
        assert_eq!(flows[1]["tid"], flows[2]["tid"]);
        assert_eq!(flows[2]["name"], "2->0 12B");
        // Memory counters.
        let c = by_ph(&ev, "C");
        assert_eq!(c[0]["name"], "memory");
        assert_eq!(c[0]["pid"], 1);
        assert_eq!(c[0]["args"]["activations"].as_f64().unwrap(), 1.0e9);
        assert_eq!(c[0]["args"]["moved_weights"].as_f64().unwrap(), 2048.0);
        assert_eq!(c[1]["pid"], 3);
        assert_eq!(c[1]["ts"].as_f64().unwrap(), 1.5);
        assert_eq!(c[1]["args"]["moved_weights"].as_f64().unwrap(), 0.5);
    }

    #[test]
    fn deterministic() {
        let t = timeline();
        let a = names_default(&t);
        let b = names_default(&t.clone());
        assert_eq!(a, b);
        // Device order in `devices` does not matter for the metadata.
        let mut t2 = t.clone();
        t2.devices = vec![2, 0];
        t2.stages = vec![1, 0];
        assert_eq!(a, names_default(&t2));
    }

    #[test]
    fn escaping() {
        let t = timeline();
        let nasty = "a\"b\\c\nd\te\u{1}f\u{7f}g é 🚀 </script>";
        let link = |l: u32| format!("{nasty}{l}");
        let dev = |d: u32| format!("{nasty}{d}");
        let json = chrome_trace(&t, &TraceNames { link_name: &link, device_name: &dev });
        let ev = events(&json);
        let procs = meta(&ev, "process_name");
        assert_eq!(procs[0]["args"]["name"].as_str().unwrap(), format!("{nasty}0"));
        let threads = meta(&ev, "thread_name");
        assert_eq!(threads.last().unwrap()["args"]["name"].as_str().unwrap(), format!("{nasty}7"));
        let mut s = String::new();
        escape_into(&mut s, "x\u{0}y\u{1f}");
        assert_eq!(s, "x\\u0000y\\u001f");
    }

    #[test]
    fn empty_and_odd_inputs() {
        let t = Timeline::default();
        let ev = events(&names_default(&t));
        assert!(ev.is_empty());
        // A label index out of range and a flow with no real link still give valid JSON.
        let mut t = timeline();
        t.spans.push(span(5, StreamKind::Compute, 10, 5, 99, 2));
        t.flows.push(FlowSpan {
            links: [u32::MAX, u32::MAX],
            source: 0,
            target: 1,
            start_ns: 0,
            end_ns: 1,
            bytes: f64::NAN,
        });
        let ev = events(&names_default(&t));
        let x = by_ph(&ev, "X");
        assert_eq!(x.len(), 6 + 3);
        assert_eq!(x[5]["name"], "label99 mb2");
        assert_eq!(x[5]["dur"].as_f64().unwrap(), 0.0);
    }
}
