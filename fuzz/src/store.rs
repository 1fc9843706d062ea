//! Counts per command and class, distinct failure signatures, and the smallest failing input
//! of each written to the output folder.

use crate::case::{Case, RunResult, write_input};
use crate::check::Class;
use std::collections::BTreeMap;
use std::path::PathBuf;

pub const COMMANDS: [&str; 7] = ["simulate", "train-run", "partition", "slices", "capacity", "search", "nccl-test"];

/// The smallest input seen for one signature.
#[derive(Clone, Debug)]
pub struct Example {
    pub class: Class,
    pub case: u64,
    pub args: Vec<String>,
    pub text: Vec<u8>,
    pub files: Vec<(String, Vec<u8>)>,
    pub tags: Vec<String>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

#[derive(Default)]
pub struct Store {
    pub counts: BTreeMap<(String, Class), u64>,
    /// signature -> (runs, smallest example)
    pub signatures: BTreeMap<String, (u64, Example)>,
    pub out: Option<PathBuf>,
    pub runs: u64,
    pub wall_s: f64,
}

/// A folder name for a signature: its class and a stable hash.
pub fn slug(class: Class, signature: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in signature.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    format!("{}-{:08x}", class.name().replace('/', "-"), h as u32)
}

impl Store {
    /// Record one run; returns the signature if it is a failure seen for the first time.
    pub fn add(&mut self, case: &Case, r: &RunResult) -> Option<String> {
        self.runs += 1;
        self.wall_s += r.outcome.wall_s;
        let class = r.verdict.class;
        *self.counts.entry((r.args[0].clone(), class)).or_default() += 1;
        if !class.is_failure() {
            return None;
        }
        let sig = r.verdict.signature(&r.args[0], &case.tags);
        let ex = Example {
            class,
            case: case.id,
            args: r.args.clone(),
            text: case.text.clone(),
            files: case.files.clone(),
            tags: case.tags.clone(),
            stdout: r.outcome.stdout.clone(),
            stderr: r.outcome.stderr.clone(),
        };
        let size = |e: &Example| e.text.len() + e.files.iter().map(|f| f.1.len()).sum::<usize>();
        let (new, better) = match self.signatures.get_mut(&sig) {
            None => {
                self.signatures.insert(sig.clone(), (1, ex));
                (true, true)
            }
            Some((n, old)) => {
                *n += 1;
                let better = size(&ex) < size(old);
                if better {
                    *old = ex;
                }
                (false, better)
            }
        };
        if better {
            self.write(&sig);
        }
        new.then_some(sig)
    }

    /// Write (or rewrite) the example of `sig` to the output folder.
    pub fn write(&self, sig: &str) {
        let (Some(out), Some((n, ex))) = (&self.out, self.signatures.get(sig)) else { return };
        let dir = out.join(slug(ex.class, sig));
        let _ = std::fs::remove_dir_all(&dir);
        let cut = |b: &[u8]| b[..b.len().min(64 << 10)].to_vec();
        let res = write_input(&dir, &ex.text, &ex.files).and_then(|_| {
            let cmd = format!(
                "signature: {sig}\nruns: {n} (so far)\ncase: {} ({})\ncommand: trainsim {}\n",
                ex.case,
                ex.tags.join(" "),
                ex.args.join(" ")
            );
            std::fs::write(dir.join("command.txt"), cmd)?;
            std::fs::write(dir.join("stdout.txt"), cut(&ex.stdout))?;
            std::fs::write(dir.join("stderr.txt"), cut(&ex.stderr))
        });
        if let Err(e) = res {
            eprintln!("scenario-fuzz: cannot write {}: {e}", dir.display());
        }
    }

    pub fn failures(&self) -> u64 {
        self.counts.iter().filter(|((_, c), _)| c.is_failure()).map(|(_, n)| n).sum()
    }

    /// The summary table: runs per command and class, then the distinct signatures.
    pub fn summary(&self) -> String {
        let mut s = format!("{:<10}", "command");
        for c in Class::ALL {
            s += &format!(" {:>13}", c.name());
        }
        s += &format!(" {:>7}\n", "runs");
        let mut rows: Vec<&str> = COMMANDS.to_vec();
        rows.push("all");
        for cmd in rows {
            let n = |c: Class| -> u64 {
                self.counts.iter().filter(|((k, cc), _)| *cc == c && (cmd == "all" || k == cmd)).map(|(_, n)| n).sum()
            };
            s += &format!("{cmd:<10}");
            for c in Class::ALL {
                s += &format!(" {:>13}", n(c));
            }
            s += &format!(" {:>7}\n", Class::ALL.iter().map(|&c| n(c)).sum::<u64>());
        }
        s += &format!("{:<10}", "distinct");
        for c in Class::ALL {
            let d = self.signatures.values().filter(|(_, e)| e.class == c).count();
            s += &format!(" {:>13}", if c.is_failure() { d.to_string() } else { "-".into() });
        }
        s += &format!(" {:>7}\n", self.signatures.len());
        s
    }

    /// One line per signature, most frequent first.
    pub fn signature_list(&self) -> String {
        let mut v: Vec<(&String, &(u64, Example))> = self.signatures.iter().collect();
        v.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(b.0)));
        v.iter().map(|(sig, (n, e))| format!("{n:>6}  {}  {sig}\n", slug(e.class, sig))).collect()
    }
}
