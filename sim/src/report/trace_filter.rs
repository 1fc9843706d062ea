//! Which part of a recorded [`Timeline`] a trace keeps: devices, streams, a time window and
//! the interconnect. A GPT-3 175B iteration on 1024 GPUs records tens of millions of spans;
//! Perfetto's UI struggles above about 1 GB, so by default a large run is traced on one
//! device per pipeline stage.

use std::collections::BTreeSet;

use super::timeline::*;
use crate::lower::STREAMS;

/// What to keep. `None` keeps everything of that dimension.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceFilter {
    pub devices: Option<BTreeSet<u32>>,
    pub streams: Option<BTreeSet<StreamKind>>,
    /// [start, end) in nanoseconds from the iteration's start.
    pub window_ns: Option<(u64, u64)>,
    /// Keep the flows on links between two kept devices.
    pub links: bool,
}

impl TraceFilter {
    /// Everything.
    pub fn all() -> TraceFilter {
        TraceFilter { links: true, ..TraceFilter::default() }
    }

    fn device(&self, d: u32) -> bool {
        self.devices.as_ref().is_none_or(|s| s.contains(&d))
    }

    fn overlaps(&self, start_ns: u64, end_ns: u64) -> bool {
        self.window_ns.is_none_or(|(a, b)| end_ns >= a && start_ns < b)
    }

    /// The part of `t` this filter keeps (labels and per-device tables whole).
    pub fn apply(&self, t: &Timeline) -> Timeline {
        let keep_stream = |s: StreamKind| self.streams.as_ref().is_none_or(|k| k.contains(&s));
        let spans = t
            .spans
            .iter()
            .filter(|s| self.device(s.device) && keep_stream(s.stream) && self.overlaps(s.start_ns, s.end_ns))
            .copied()
            .collect();
        let flows = if self.links {
            t.flows
                .iter()
                .filter(|f| self.device(f.source) && self.device(f.target) && self.overlaps(f.start_ns, f.end_ns))
                .copied()
                .collect()
        } else {
            Vec::new()
        };
        let memory =
            t.memory.iter().filter(|m| self.device(m.device) && self.overlaps(m.time_ns, m.time_ns)).copied().collect();
        let kept: Vec<usize> = (0..t.devices.len()).filter(|&i| self.device(t.devices[i])).collect();
        let pick = |v: &[MemoryBreakdown]| kept.iter().filter_map(|&i| v.get(i).copied()).collect();
        Timeline {
            labels: t.labels.clone(),
            spans,
            flows,
            memory,
            devices: kept.iter().map(|&i| t.devices[i]).collect(),
            stages: kept.iter().filter_map(|&i| t.stages.get(i).copied()).collect(),
            static_hbm: pick(&t.static_hbm),
            static_host: pick(&t.static_host),
            hbm_capacity_bytes: t.hbm_capacity_bytes,
            host_capacity_bytes: t.host_capacity_bytes,
            iteration_ns: t.iteration_ns,
            stream_busy_ns: kept
                .iter()
                .flat_map(|&i| t.stream_busy_ns.get(i * STREAMS..(i + 1) * STREAMS).unwrap_or(&[]))
                .copied()
                .collect(),
        }
    }
}

/// Parse a device list: "all", or comma-separated ids and inclusive ranges ("0-7,64").
pub fn parse_devices(spec: &str) -> Result<Option<BTreeSet<u32>>, String> {
    if spec.trim() == "all" {
        return Ok(None);
    }
    let mut set = BTreeSet::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("\"{part}\" is not a device id or range (expected e.g. 0-7,64 or all)");
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>().map_err(|_| bad())?, b.trim().parse::<u32>().map_err(|_| bad())?),
            None => {
                let a = part.parse::<u32>().map_err(|_| bad())?;
                (a, a)
            }
        };
        if b < a || b - a > 1 << 20 {
            return Err(bad());
        }
        set.extend(a..=b);
    }
    if set.is_empty() {
        return Err(format!("\"{spec}\" names no device"));
    }
    Ok(Some(set))
}

/// Parse a stream list: "all", or comma-separated stream names (see [`StreamKind::name`]).
pub fn parse_streams(spec: &str) -> Result<Option<BTreeSet<StreamKind>>, String> {
    if spec.trim() == "all" {
        return Ok(None);
    }
    let names: Vec<&str> = StreamKind::ALL.iter().map(|s| s.name()).collect();
    spec.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            StreamKind::ALL
                .iter()
                .copied()
                .find(|s| s.name() == p)
                .ok_or_else(|| format!("\"{p}\" is not a stream; streams: {}, or all", names.join(", ")))
        })
        .collect::<Result<BTreeSet<_>, _>>()
        .map(Some)
}

/// Parse a window "START:END" in seconds from the iteration's start (either side may be empty).
pub fn parse_window(spec: &str) -> Result<(u64, u64), String> {
    let bad = || format!("\"{spec}\" is not a window START:END in seconds (e.g. 0.5:1.25, or :2)");
    let (a, b) = spec.split_once(':').ok_or_else(bad)?;
    let secs = |x: &str, dflt: f64| -> Result<f64, String> {
        let x = x.trim();
        if x.is_empty() { Ok(dflt) } else { x.parse::<f64>().map_err(|_| bad()) }
    };
    let (a, b) = (secs(a, 0.0)?, secs(b, 1e9)?);
    if !(a.is_finite() && b.is_finite() && a >= 0.0 && b > a) {
        return Err(bad());
    }
    Ok(((a * 1e9) as u64, (b * 1e9).min(u64::MAX as f64) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(device: u32, stream: StreamKind, start_ns: u64, end_ns: u64) -> Span {
        Span { device, stream, start_ns, end_ns, label: 0, micro_batch: 0 }
    }

    #[test]
    fn keeps_exactly_the_chosen_devices_streams_and_window() {
        let t = Timeline {
            spans: vec![
                span(0, StreamKind::Compute, 0, 10),
                span(1, StreamKind::Compute, 0, 10),
                span(0, StreamKind::DataParallel, 20, 30),
                span(0, StreamKind::Compute, 40, 50),
            ],
            devices: vec![0, 1],
            stages: vec![0, 1],
            ..Timeline::default()
        };
        let f = TraceFilter {
            devices: parse_devices("0").unwrap(),
            streams: parse_streams("compute").unwrap(),
            window_ns: Some((5, 45)),
            links: false,
        };
        let kept = f.apply(&t);
        let got: Vec<(u32, u64)> = kept.spans.iter().map(|s| (s.device, s.start_ns)).collect();
        assert_eq!(got, vec![(0, 0), (0, 40)]);
        assert_eq!(kept.devices, vec![0]);
        assert_eq!(TraceFilter::all().apply(&t).spans.len(), 4);
    }

    #[test]
    fn lists_parse_and_bad_ones_say_what_is_allowed() {
        assert_eq!(parse_devices("0-2, 7").unwrap().unwrap().into_iter().collect::<Vec<_>>(), vec![0, 1, 2, 7]);
        assert_eq!(parse_devices("all").unwrap(), None);
        assert!(parse_devices("3-1").is_err() && parse_devices("x").is_err() && parse_devices(",").is_err());
        assert!(parse_streams("pp-send,gather").unwrap().unwrap().contains(&StreamKind::Gather));
        assert!(parse_streams("nope").unwrap_err().contains("compute"));
        // Every stream kind has a name the list takes.
        let every: Vec<&str> = StreamKind::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(parse_streams(&every.join(",")).unwrap().unwrap().len(), StreamKind::ALL.len());
        assert!(parse_streams("tp-async").unwrap().unwrap().contains(&StreamKind::TensorAsync));
        assert_eq!(parse_window("0.5:1").unwrap(), (500_000_000, 1_000_000_000));
        assert!(parse_window("2:1").is_err() && parse_window("1").is_err() && parse_window("nan:1").is_err());
    }
}
