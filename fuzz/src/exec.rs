//! Runs the trainsim binary as a child process under a CPU-time limit, a wall-clock backstop and
//! an address-space limit (Linux: `sh -c 'ulimit -S -t ...; ulimit -v ...; exec ...'`),
//! capturing a bounded amount of its output. The soft CPU limit ends a run with SIGXCPU, told
//! apart from the SIGKILL of the out-of-memory killer.
//!
//! The time limit is on CPU seconds (all threads together) so that a loaded machine does not turn
//! a slow-but-bounded run into a false timeout; the wall-clock backstop ([`WALL_FACTOR`] times the
//! limit) still catches a run that hangs without using the CPU.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Bytes kept of each output stream; the rest is read and dropped so the child never blocks.
const KEEP_BYTES: usize = 8 << 20;

/// The wall-clock backstop, as a multiple of the CPU-time limit (plus [`WALL_SLACK`]).
pub const WALL_FACTOR: u32 = 10;
const WALL_SLACK: Duration = Duration::from_secs(2);
/// The signal the kernel sends a process past its CPU-time limit (`RLIMIT_CPU`) on Linux.
pub const SIGXCPU: i32 = 24;

/// Limits one run is held to.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// CPU-time limit of one run (all its threads together).
    pub timeout: Duration,
    /// CPU-time limit of a `capacity`, `partition` or `search` run: a search over dozens to
    /// thousands of whole simulations, each seconds on a large cluster.
    pub search_timeout: Duration,
    /// Address-space limit in MiB (`ulimit -v`); 0 = none.
    pub mem_mib: u64,
}

/// How a run ended and what it wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Signal that ended it, if one did (a kill on timeout included).
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub wall_s: f64,
}

impl Outcome {
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 64 * 1024];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = KEEP_BYTES.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        kept
    })
}

/// Run `bin args...` in `dir` under `limits`. Errors only when the process cannot be started.
pub fn run(bin: &Path, args: &[String], dir: &Path, limits: Limits) -> std::io::Result<Outcome> {
    let search = matches!(args.first().map(String::as_str), Some("capacity" | "partition" | "search"));
    let limit = if search { limits.search_timeout } else { limits.timeout };
    // `ulimit -t` takes whole seconds; round up so a sub-second limit is not zero (= none).
    let cpu_s = limit.as_secs() + u64::from(limit.subsec_nanos() > 0);
    let mut script = format!("ulimit -S -t {cpu_s} || exit 125; ");
    if limits.mem_mib > 0 {
        script += &format!("ulimit -v {} || exit 125; ", limits.mem_mib * 1024);
    }
    script += "exec \"$@\"";
    let wall = limit * WALL_FACTOR + WALL_SLACK;
    let start = Instant::now();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(bin)
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = drain(child.stdout.take().expect("piped"));
    let err = drain(child.stderr.take().expect("piped"));
    let mut pause = Duration::from_millis(1);
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() >= wall {
            timed_out = true;
            let _ = child.kill();
            break child.wait()?;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    };
    let wall_s = start.elapsed().as_secs_f64();
    Ok(Outcome {
        code: status.code(),
        signal: status.signal(),
        timed_out: timed_out || status.signal() == Some(SIGXCPU),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        wall_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_past_its_cpu_limit_is_killed_and_marked() {
        let limits = Limits { timeout: Duration::from_secs(1), search_timeout: Duration::from_secs(1), mem_mib: 0 };
        let args = ["-c".to_string(), "while :; do :; done".to_string()];
        let o = run(Path::new("sh"), &args, Path::new("."), limits).unwrap();
        assert!(o.timed_out);
        assert_eq!(o.signal, Some(SIGXCPU));
        assert!(o.wall_s < 15.0, "killed at {} s", o.wall_s);
    }

    #[test]
    fn a_run_that_hangs_without_cpu_meets_the_wall_backstop() {
        let limits =
            Limits { timeout: Duration::from_millis(100), search_timeout: Duration::from_millis(100), mem_mib: 0 };
        let o = run(Path::new("sleep"), &["60".into()], Path::new("."), limits).unwrap();
        assert!(o.timed_out);
        assert!(o.wall_s < 30.0, "killed at {} s", o.wall_s);
        assert_eq!(o.code, None);
    }

    #[test]
    fn exit_code_and_streams_are_captured() {
        let limits = Limits { timeout: Duration::from_secs(10), search_timeout: Duration::from_secs(10), mem_mib: 512 };
        let args = ["-c".to_string(), "echo out; echo err >&2; exit 3".to_string()];
        let o = run(Path::new("sh"), &args, Path::new("."), limits).unwrap();
        assert_eq!((o.code, o.timed_out), (Some(3), false));
        assert_eq!(o.stdout, b"out\n");
        assert_eq!(o.stderr_text(), "err\n");
    }
}
