//! The algorithms and protocols a run lets NCCL use: its `NCCL_ALGO` and `NCCL_PROTO`
//! environment variables (`cluster.nccl` in a scenario, `--algo` and `--proto` in
//! `trainsim nccl-test`).
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
}

impl Default for NcclEnv {
    fn default() -> NcclEnv {
        NcclEnv { algo: None, proto: None, algos: u8::MAX, protos: u8::MAX }
    }
}

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
        !self.restricted()
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
