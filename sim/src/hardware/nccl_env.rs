//! The algorithms and protocols a run lets NCCL use: its `NCCL_ALGO` and `NCCL_PROTO`
//! environment variables (`cluster.nccl` in a scenario, `--algo` and `--proto` in
//! `trainsim nccl-test`); and the NCCL release and `NCCL_RUNTIME_CONNECT`, which decide what
//! memory its communicators hold (`hardware::nccl_memory`).
//!
//! The syntax is NCCL's (NVIDIA/nccl `src/graph/tuning.cc`, `parseList`, read at 2.30): a
//! comma-separated list of names, case-insensitive, that enables only those; a list that starts
//! with `^` disables those and keeps the rest. NCCL then tunes among what is left (`getAlgoInfo`
//! in `src/enqueue.cc`) and fails a collective for which nothing is left ("no algorithm/protocol
//! available"); so does trainsim. The restriction applies to the collectives NCCL tunes
//! (all-reduce, all-gather, reduce-scatter, broadcast, reduce); all-to-all's grouped sends are
//! scheduled without it, as NCCL's point-to-point work is.

use serde::Serialize;

use super::nccl::{Algo, Proto};

/// Algorithm names NCCL accepts: the three trainsim models, then those it does not (never
/// chosen in the model: NVLS-Tree and CollNet need NVLink SHARP across nodes or a SHARP
/// network, PAT runs one GPU per node; docs/reference/collectives.md).
const ALGOS: [(&str, Option<Algo>); 7] = [
    ("ring", Some(Algo::Ring)),
    ("tree", Some(Algo::Tree)),
    ("nvls", Some(Algo::Nvls)),
    ("nvlstree", None),
    ("collnetdirect", None),
    ("collnetchain", None),
    ("pat", None),
];
const PROTOS: [(&str, Proto); 3] = [("ll", Proto::Ll), ("ll128", Proto::Ll128), ("simple", Proto::Simple)];

/// Which algorithms and protocols NCCL may use (all by default).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NcclEnv {
    /// `NCCL_ALGO` as given, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algo: Option<String>,
    /// `NCCL_PROTO` as given, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    /// Enabled algorithms and protocols, a bit each ([`algo_bit`], [`proto_bit`]).
    #[serde(skip)]
    algos: u8,
    #[serde(skip)]
    protos: u8,
    /// The NCCL release the run uses, as given ("2.19"), if any: it decides the
    /// communicators' memory only (the tuning model is 2.30's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `NCCL_RUNTIME_CONNECT` as given (NCCL 2.22 and later), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_connect: Option<bool>,
    /// The release's minor number (2.x): 30, the model's, unless `version` says.
    #[serde(skip)]
    minor: u32,
}

impl Default for NcclEnv {
    fn default() -> NcclEnv {
        NcclEnv {
            algo: None,
            proto: None,
            algos: u8::MAX,
            protos: u8::MAX,
            version: None,
            runtime_connect: None,
            minor: MODEL_MINOR,
        }
    }
}

/// The NCCL release trainsim's tuning constants are read from: 2.30.
const MODEL_MINOR: u32 = 30;
/// The first release with `NCCL_RUNTIME_CONNECT` (2.22.3, June 2024; `src/init.cc`): before
/// it every communicator connected its rings and trees, and NVLS where the node has it, when
/// it was created.
const RUNTIME_CONNECT_MINOR: u32 = 22;
/// The first release whose NVLS buffers are `NCCL_NVLS_CHUNKSIZE` (128 KiB) x 8 steps (2.21.5,
/// `src/transport/nvls.cc`); before it a buffer was the Simple protocol's 4 MiB.
const NVLS_CHUNK_MINOR: u32 = 21;
/// The oldest release accepted: 2.4, NCCL's tree algorithm (and the first of the 2.x
/// generations trainsim's model describes at all).
const OLDEST_MINOR: u32 = 4;

fn algo_bit(a: Algo) -> u8 {
    match a {
        Algo::Ring => 1,
        Algo::Tree => 2,
        Algo::Nvls => 4,
        // Grouped sends are not tuned by NCCL_ALGO.
        Algo::P2p => u8::MAX,
    }
}

fn proto_bit(p: Proto) -> u8 {
    1 << p.index()
}

/// NCCL's list syntax over `names`: the bits enabled, or what is wrong with the list.
fn parse_list<T: Copy>(what: &str, list: &str, names: &[(&str, T)], bit: impl Fn(T) -> u8) -> Result<u8, String> {
    let (exclude, body) = match list.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, list.trim()),
    };
    let mut listed = 0u8;
    for token in body.split(',').map(str::trim) {
        if token.is_empty() {
            return Err(format!("{list:?} has an empty name; expected {what} names separated by commas"));
        }
        let lower = token.to_ascii_lowercase();
        let Some(&(_, v)) = names.iter().find(|(n, _)| *n == lower) else {
            let known: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
            return Err(format!("unknown {what} {token:?}; NCCL knows {} (case does not matter)", known.join(", ")));
        };
        listed |= bit(v);
    }
    Ok(if exclude { !listed } else { listed })
}

impl NcclEnv {
    /// The environment `NCCL_ALGO` = `algo` and `NCCL_PROTO` = `proto` give (either may be
    /// unset), or what is wrong with one of them.
    pub fn parse(algo: Option<&str>, proto: Option<&str>) -> Result<NcclEnv, String> {
        let mut env = NcclEnv::default();
        if let Some(a) = algo {
            env.algos = parse_list("algorithm", a, &ALGOS, |v: Option<Algo>| v.map_or(0, algo_bit))
                .map_err(|e| format!("NCCL_ALGO: {e}"))?;
            if env.algos & 7 == 0 {
                return Err(format!(
                    "NCCL_ALGO: {a:?} leaves none of the algorithms trainsim models (ring, tree, nvls); NVLS-Tree, \
                     CollNet and PAT are never chosen in the model"
                ));
            }
            env.algo = Some(a.trim().to_string());
        }
        if let Some(p) = proto {
            env.protos = parse_list("protocol", p, &PROTOS, proto_bit).map_err(|e| format!("NCCL_PROTO: {e}"))?;
            if env.protos & 7 == 0 {
                return Err(format!("NCCL_PROTO: {p:?} leaves no protocol (LL, LL128, Simple)"));
            }
            env.proto = Some(p.trim().to_string());
        }
        Ok(env)
    }

    /// The same environment run on NCCL release `version` ("2.19", "2.21.5") with
    /// `NCCL_RUNTIME_CONNECT` = `runtime_connect` (either may be unset), or what is wrong.
    pub fn with_release(mut self, version: Option<&str>, runtime_connect: Option<bool>) -> Result<NcclEnv, String> {
        if let Some(v) = version {
            let parts: Vec<&str> = v.trim().split('.').collect();
            let nums: Option<Vec<u32>> = parts.iter().map(|p| p.parse::<u32>().ok()).collect();
            let minor = match nums.as_deref() {
                Some([2, minor, ..]) if parts.len() <= 3 => *minor,
                _ => {
                    return Err(format!(
                        "{v:?} is not an NCCL 2.x release; expected \"2.MINOR\" or \"2.MINOR.PATCH\", e.g. \"2.19\""
                    ));
                }
            };
            if !(OLDEST_MINOR..=MODEL_MINOR).contains(&minor) {
                return Err(format!("{v:?}; allowed: 2.{OLDEST_MINOR} to 2.{MODEL_MINOR}"));
            }
            self.minor = minor;
            self.version = Some(v.trim().to_string());
        }
        if let Some(rc) = runtime_connect {
            if rc && self.minor < RUNTIME_CONNECT_MINOR {
                return Err(format!(
                    "true needs NCCL 2.{RUNTIME_CONNECT_MINOR} or later (NCCL_RUNTIME_CONNECT is new in \
                     2.22.3); version {} connects every communicator when it is created",
                    self.version.as_deref().unwrap_or("")
                ));
            }
            self.runtime_connect = Some(rc);
        }
        Ok(self)
    }

    /// Whether a communicator connects its rings and trees (and NVLS, where the node has it)
    /// when created, not each algorithm when a collective first takes it.
    pub fn connects_at_creation(&self) -> bool {
        self.runtime_connect == Some(false) || self.minor < RUNTIME_CONNECT_MINOR
    }

    /// Bytes of one NVLS buffer (`nccl_memory::nvls_buffer_bytes`) on this release.
    pub fn nvls_buffer_bytes(&self) -> f64 {
        super::nccl_memory::nvls_buffer_bytes(self.minor >= NVLS_CHUNK_MINOR)
    }

    /// Whether NCCL may run `algo` with `proto`.
    pub fn allows(&self, algo: Algo, proto: Proto) -> bool {
        self.algos & algo_bit(algo) != 0 && self.protos & proto_bit(proto) != 0
    }

    /// Whether anything is restricted.
    pub fn restricted(&self) -> bool {
        self.algo.is_some() || self.proto.is_some()
    }

    /// Nothing restricted (serde's test for leaving it out of a report).
    pub fn is_default(&self) -> bool {
        !self.restricted() && self.version.is_none() && self.runtime_connect.is_none()
    }

    /// `NCCL_ALGO=... NCCL_PROTO=...` as given, for messages.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(a) = &self.algo {
            parts.push(format!("NCCL_ALGO={a}"));
        }
        if let Some(p) = &self.proto {
            parts.push(format!("NCCL_PROTO={p}"));
        }
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nccl_s_lists_and_their_exclusions() {
        let e = NcclEnv::parse(Some("Ring,tree"), Some("^LL128")).expect("valid");
        assert!(e.allows(Algo::Ring, Proto::Simple) && e.allows(Algo::Tree, Proto::Ll));
        assert!(!e.allows(Algo::Nvls, Proto::Simple) && !e.allows(Algo::Ring, Proto::Ll128));
        assert_eq!(e.describe(), "NCCL_ALGO=Ring,tree NCCL_PROTO=^LL128");
        let nvls_off = NcclEnv::parse(Some("^nvls,nvlstree"), None).expect("valid");
        assert!(nvls_off.allows(Algo::Ring, Proto::Ll128) && !nvls_off.allows(Algo::Nvls, Proto::Simple));
        let all = NcclEnv::default();
        assert!(!all.restricted() && all.allows(Algo::Nvls, Proto::Ll));
        // Grouped sends are never restricted by NCCL_ALGO.
        assert!(NcclEnv::parse(Some("tree"), None).expect("valid").allows(Algo::P2p, Proto::Simple));
    }

    #[test]
    fn a_release_decides_when_communicators_connect_and_nvls_s_step() {
        let model = NcclEnv::default();
        assert!(!model.connects_at_creation() && model.is_default());
        assert_eq!(model.nvls_buffer_bytes(), 1048576.0);
        let old = NcclEnv::default().with_release(Some("2.19.4"), None).expect("valid");
        assert!(old.connects_at_creation() && !old.is_default());
        assert_eq!(old.nvls_buffer_bytes(), 4194304.0);
        let v21 = NcclEnv::default().with_release(Some("2.21"), None).expect("valid");
        assert!(v21.connects_at_creation() && v21.nvls_buffer_bytes() == 1048576.0);
        let off = NcclEnv::default().with_release(None, Some(false)).expect("valid");
        assert!(off.connects_at_creation());
        for (v, rc, says) in [
            (Some("3.0"), None, "not an NCCL 2.x release"),
            (Some("2.x"), None, "not an NCCL 2.x release"),
            (Some("2.31"), None, "allowed: 2.4 to 2.30"),
            (Some("2.19"), Some(true), "needs NCCL 2.22 or later"),
        ] {
            let e = NcclEnv::default().with_release(v, rc).expect_err("refused");
            assert!(e.contains(says), "{v:?} {rc:?}: {e}");
        }
    }

    #[test]
    fn refuses_unknown_names_and_lists_that_leave_nothing() {
        for (algo, proto, says) in [
            (Some("ring,Bus"), None, "unknown algorithm \"Bus\""),
            (Some("ring,"), None, "empty name"),
            (Some("PAT"), None, "none of the algorithms trainsim models"),
            (Some("^ring,tree,nvls"), None, "none of the algorithms"),
            (None, Some("^LL,LL128,Simple"), "leaves no protocol"),
            (None, Some("LL256"), "unknown protocol"),
        ] {
            let e = NcclEnv::parse(algo, proto).expect_err("refused");
            assert!(e.contains(says), "{algo:?} {proto:?}: {e}");
        }
    }
}
