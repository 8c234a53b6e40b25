//! The per-rank trace files of a directory (written with `HCCN_TRACE`), read into one model.

use std::path::Path;

use serde_json::Value;

/// One operation as one rank ran it; times in µs on the shared wall clock.
#[derive(Debug, Clone)]
pub struct OpSpan {
    pub rank: u32,
    pub name: String,
    pub bytes: u64,
    pub start_us: f64,
    pub dur_us: f64,
}

/// Bytes one rank sent to another (world ranks).
#[derive(Debug, Clone, Copy)]
pub struct Send {
    pub src: u32,
    pub dst: u32,
    pub bytes: u64,
    /// How long the send took, µs.
    pub us: f64,
}

/// A slow stretch of a link as its receiving rank saw it: bytes crawled in from `from`.
#[derive(Debug, Clone, Copy)]
pub struct Straggler {
    pub from: u32,
    pub at: u32,
    pub us: f64,
}

#[derive(Debug, Default)]
pub struct Trace {
    pub ops: Vec<OpSpan>,
    pub sends: Vec<Send>,
    pub stragglers: Vec<Straggler>,
    /// One more than the highest rank seen (a file's own or a peer's).
    pub ranks: u32,
    pub files: usize,
}

fn field<'a>(v: &'a Value, key: &str, file: &Path) -> Result<&'a Value, String> {
    match &v[key] {
        Value::Null => Err(format!("{}: an event lacks {key:?}", file.display())),
        x => Ok(x),
    }
}

fn number(v: &Value, key: &str, file: &Path) -> Result<f64, String> {
    field(v, key, file)?.as_f64().ok_or_else(|| format!("{}: {key:?} is not a number", file.display()))
}

fn rank_of(x: f64, what: &str, file: &Path) -> Result<u32, String> {
    if x >= 0.0 && x < f64::from(u32::MAX) && x.fract() == 0.0 {
        Ok(x as u32)
    } else {
        Err(format!("{}: {what} {x} is not a rank", file.display()))
    }
}

impl Trace {
    /// Reads every `hccn-trace-*.json` in `dir`.
    pub fn load(dir: &Path) -> Result<Trace, String> {
        let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let mut paths: Vec<_> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name.starts_with("hccn-trace-") && name.ends_with(".json")
            })
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(format!("no hccn-trace-*.json files in {}", dir.display()));
        }
        let mut t = Trace::default();
        for p in &paths {
            t.add_file(p)?;
        }
        Ok(t)
    }

    fn add_file(&mut self, file: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let doc: Value =
            serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", file.display()))?;
        let meta = field(&doc, "otherData", file)?;
        let rank = rank_of(number(meta, "rank", file)?, "rank", file)?;
        let origin = number(meta, "start_unix_us", file)?;
        let events = field(&doc, "traceEvents", file)?
            .as_array()
            .ok_or_else(|| format!("{}: traceEvents is not a list", file.display()))?;
        self.ranks = self.ranks.max(rank + 1);
        self.files += 1;
        for e in events {
            let args = field(e, "args", file)?;
            match e["cat"].as_str() {
                Some("op") => self.ops.push(OpSpan {
                    rank,
                    name: field(e, "name", file)?.as_str().unwrap_or("?").to_owned(),
                    bytes: number(args, "bytes", file)? as u64,
                    start_us: origin + number(e, "ts", file)?,
                    dur_us: number(e, "dur", file)?,
                }),
                Some("transfer") if args["dir"] == "send" => {
                    let dst = rank_of(number(args, "peer_world", file)?, "peer_world", file)?;
                    self.ranks = self.ranks.max(dst + 1);
                    let bytes = number(args, "bytes", file)? as u64;
                    self.sends.push(Send { src: rank, dst, bytes, us: number(e, "dur", file)? });
                }
                Some("link") => {
                    let from = rank_of(number(args, "peer_world", file)?, "peer_world", file)?;
                    self.stragglers.push(Straggler { from, at: rank, us: number(e, "dur", file)? });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Bytes sent, `[src][dst]`.
    pub fn matrix(&self) -> Vec<Vec<u64>> {
        self.per_link(|s| s.bytes)
    }

    /// Time spent sending, µs, `[src][dst]`.
    pub fn time_matrix(&self) -> Vec<Vec<u64>> {
        self.per_link(|s| s.us.round() as u64)
    }

    fn per_link(&self, value: impl Fn(&Send) -> u64) -> Vec<Vec<u64>> {
        let n = self.ranks as usize;
        let mut m = vec![vec![0u64; n]; n];
        for s in &self.sends {
            m[s.src as usize][s.dst as usize] += value(s);
        }
        m
    }
}
