//! Files the commands write besides their report: checked before the work starts, traces
//! filtered to a size a person can open, and progress on stderr while long work runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use sim::hardware::Topology;
use sim::report::timeline::Timeline;
use sim::report::trace::{TraceNames, chrome_trace};
use sim::report::trace_filter::{self, TraceFilter};
use sim::scenario::Scenario;

/// Devices a trace keeps by default before it asks for `--trace-devices all`.
pub const DEFAULT_TRACE_DEVICES: usize = 16;

/// The trace options of `simulate`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TraceArgs {
    /// Also write a trace of the iteration: Perfetto's protobuf format when FILE ends in
    /// .pftrace, .perfetto-trace or .pb (compact; open in ui.perfetto.dev), Chrome trace-event
    /// JSON otherwise. Large runs are traced on one device per pipeline stage unless
    /// --trace-devices says otherwise.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Devices (cluster ids) to trace: "all", or ids and ranges such as "0-7,64". Default: all
    /// simulated devices up to 16, else the first replica's tensor rank 0 of each stage.
    #[arg(long, value_name = "LIST", requires = "trace")]
    pub trace_devices: Option<String>,
    /// Streams to trace: "all" (default) or a list of compute, dp-comm, pp-send, gather,
    /// host-copy, tp-comm, ep-comm, tp-async.
    #[arg(long, value_name = "LIST", requires = "trace")]
    pub trace_streams: Option<String>,
    /// Time window to trace, START:END in seconds from the iteration's start (e.g. 0:0.5).
    #[arg(long, value_name = "START:END", requires = "trace")]
    pub trace_window: Option<String>,
    /// Leave the interconnect's flows out of the trace.
    #[arg(long, requires = "trace")]
    pub trace_no_links: bool,
}

impl TraceArgs {
    /// The filter these options ask for on scenario `s` (checked before any simulation).
    pub fn filter(&self, s: &Scenario) -> Result<(TraceFilter, Option<String>), String> {
        let mut f = TraceFilter { links: !self.trace_no_links, ..TraceFilter::default() };
        let mut note = None;
        f.devices = match &self.trace_devices {
            Some(spec) => trace_filter::parse_devices(spec).map_err(|e| format!("--trace-devices: {e}"))?,
            None => {
                let simulated = sim::lower::size::estimate(s, None).simulated_devices;
                if simulated as usize > DEFAULT_TRACE_DEVICES {
                    let stages: std::collections::BTreeSet<u32> =
                        (0..s.plan.pp).map(|k| s.plan.device(0, k, 0)).collect();
                    note = Some(format!(
                        "trace: {} of {} devices (replica 0, tensor rank 0 of each of the {} stages); \
                         --trace-devices all for every simulated device",
                        stages.len(),
                        s.plan.devices(),
                        s.plan.pp
                    ));
                    Some(stages)
                } else {
                    None
                }
            }
        };
        if let Some(spec) = &self.trace_streams {
            f.streams = trace_filter::parse_streams(spec).map_err(|e| format!("--trace-streams: {e}"))?;
        }
        if let Some(spec) = &self.trace_window {
            f.window_ns = Some(trace_filter::parse_window(spec).map_err(|e| format!("--trace-window: {e}"))?);
        }
        Ok((f, note))
    }
}

fn protobuf(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    name.ends_with(".pftrace") || name.ends_with(".perfetto-trace") || name.ends_with(".pb")
}

/// Write the part of `t` that `filter` keeps to `path`; returns the bytes written.
pub fn write_trace(path: &Path, t: &Timeline, s: &Scenario, filter: &TraceFilter) -> Result<u64, String> {
    let kept = filter.apply(t);
    let topo = Topology::new(&s.cluster);
    let link_name = |l: u32| topo.link_name(l);
    let device_name = |d: u32| {
        let (r, st, x) = s.plan.coords(d);
        format!("dev{d} (dp{r} pp{st} tp{x})")
    };
    let names = TraceNames { link_name: &link_name, device_name: &device_name };
    let bytes = if protobuf(path) {
        sim::report::perfetto::perfetto_trace(&kept, &names)
    } else {
        chrome_trace(&kept, &names).into_bytes()
    };
    std::fs::write(path, &bytes).map_err(|e| format!("cannot write trace {}: {e}", path.display()))?;
    Ok(bytes.len() as u64)
}

/// Fail now, before minutes of work, if any of `paths` cannot be written: its folder is
/// missing or not writable, or it names a folder. A file that did not exist is not left behind.
pub fn check_writable<'a>(paths: impl IntoIterator<Item = (&'a str, &'a Path)>) -> Result<(), String> {
    for (what, p) in paths {
        if p.is_dir() {
            return Err(format!("{what} {}: is a folder, not a file", p.display()));
        }
        let existed = p.exists();
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(p)
            .map_err(|e| format!("{what} {}: cannot be written: {e}", p.display()))?;
        if !existed {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(())
}

/// A spinner on stderr with the elapsed time, hidden when stderr is not a terminal.
pub fn spinner(message: impl Into<String>) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("a valid template"));
    bar.set_message(message.into());
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}
