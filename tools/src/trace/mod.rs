//! `hccn-trace DIR [--heatmap FILE.png] [--timeline FILE.png] [--summary]`: merges the per-rank
//! trace files that `HCCN_TRACE=DIR` produced and draws or summarises them.

pub mod model;
pub mod plot;

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;

use crate::args::{Args, UsageError};
use model::Trace;

const USAGE: &str =
    "usage: hccn-trace DIR [--heatmap FILE.png] [--heatmap-time FILE.png] [--timeline FILE.png] [--summary]
  Merges DIR/hccn-trace-*.json (written by ranks run with HCCN_TRACE=DIR).
  --heatmap FILE    rank x rank picture of bytes sent (row = source, column = destination)
  --heatmap-time FILE  the same for time spent sending
  --timeline FILE   one lane per rank, one box per operation, coloured by operation
  --summary         per operation: calls, bytes, time (totals over all ranks); busiest links
  --version         hccn-trace's version
";

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    pub dir: PathBuf,
    pub heatmap: Option<PathBuf>,
    pub heatmap_time: Option<PathBuf>,
    pub timeline: Option<PathBuf>,
    pub summary: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    Run(Options),
    Help,
    Version,
}

pub fn parse(mut a: Args) -> Result<Invocation, UsageError> {
    let mut o = Options::default();
    let mut dir = None;
    loop {
        match a.next_option()? {
            Some((name, inline)) => match name.as_str() {
                "-h" | "--help" => return Ok(Invocation::Help),
                "--version" => return Ok(Invocation::Version),
                "--heatmap" => o.heatmap = Some(a.value(&name, inline)?.into()),
                "--heatmap-time" => o.heatmap_time = Some(a.value(&name, inline)?.into()),
                "--timeline" => o.timeline = Some(a.value(&name, inline)?.into()),
                "--summary" => o.summary = true,
                _ => return Err(UsageError(format!("unknown option {name}"))),
            },
            None => match a.positional() {
                Some(d) if dir.is_none() => dir = Some(PathBuf::from(d)),
                Some(extra) => return Err(UsageError(format!("unexpected argument {extra:?}"))),
                None => break,
            },
        }
    }
    o.dir = dir.ok_or_else(|| UsageError("the trace directory is missing".into()))?;
    if o.heatmap.is_none() && o.heatmap_time.is_none() && o.timeline.is_none() && !o.summary {
        o.summary = true;
    }
    Ok(Invocation::Run(o))
}

/// Per operation name: (calls, bytes, µs), over all ranks.
pub fn per_op(trace: &Trace) -> BTreeMap<&str, (u64, u64, f64)> {
    let mut m: BTreeMap<&str, (u64, u64, f64)> = BTreeMap::new();
    for o in &trace.ops {
        let e = m.entry(o.name.as_str()).or_default();
        e.0 += 1;
        e.1 += o.bytes;
        e.2 += o.dur_us;
    }
    m
}

/// The summary table: operations, then the `top` busiest links.
pub fn summary(trace: &Trace, top: usize) -> Vec<String> {
    let mut out = vec![
        format!("# {} trace files, {} ranks; totals over all ranks", trace.files, trace.ranks),
        format!("{:<22} {:>10} {:>16} {:>12}", "op", "calls", "bytes", "time_ms"),
    ];
    for (name, (calls, bytes, us)) in per_op(trace) {
        out.push(format!("{name:<22} {calls:>10} {bytes:>16} {:>12.3}", us / 1000.0));
    }
    let mut links: Vec<(u64, usize, usize)> = trace
        .matrix()
        .iter()
        .enumerate()
        .flat_map(|(s, row)| row.iter().enumerate().map(move |(d, &b)| (b, s, d)))
        .filter(|l| l.0 > 0)
        .collect();
    links.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    out.push(format!("# busiest links (bytes sent, {} of {})", links.len().min(top), links.len()));
    out.push(format!("{:<22} {:>16} {:>12}", "link", "bytes", "human"));
    for (b, s, d) in links.into_iter().take(top) {
        out.push(format!("{:<22} {b:>16} {:>12}", format!("{s} -> {d}"), plot::human(b)));
    }
    // Links that carried bytes slowly while their peers were alive: slow, not dead.
    let mut slow: BTreeMap<(u32, u32), (u32, f64)> = BTreeMap::new();
    for s in &trace.stragglers {
        let e = slow.entry((s.from, s.at)).or_default();
        e.0 += 1;
        e.1 += s.us;
    }
    if !slow.is_empty() {
        out.push(format!("# straggler links ({}): slow stretches seen by the receiving rank", slow.len()));
        out.push(format!("{:<22} {:>10} {:>12}", "link", "stretches", "slow_ms"));
        for ((from, at), (n, us)) in slow {
            out.push(format!("{:<22} {n:>10} {:>12.1}", format!("{from} -> {at}"), us / 1000.0));
        }
    }
    out
}

fn run(o: &Options) -> Result<(), String> {
    let trace = Trace::load(&o.dir)?;
    if let Some(p) = &o.heatmap_time {
        plot::heatmap(&trace, plot::Measure::Time, p)?;
    }
    if let Some(p) = &o.heatmap {
        plot::heatmap(&trace, plot::Measure::Bytes, p)?;
    }
    if let Some(p) = &o.timeline {
        plot::timeline(&trace, p)?;
    }
    if (o.heatmap.is_some() || o.heatmap_time.is_some() || o.timeline.is_some()) && !plot::have_font() {
        let _ = writeln!(io::stderr(), "hccn-trace: no TrueType font found; pictures are drawn without labels");
    }
    if o.summary {
        let mut out = io::stdout().lock();
        for line in summary(&trace, 10) {
            writeln!(out, "{line}").map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// hccn-trace's entry point; returns the process exit code.
pub fn main() -> i32 {
    match parse(Args::from_env()) {
        Ok(Invocation::Help) => {
            let _ = io::stdout().write_all(USAGE.as_bytes());
            0
        }
        Ok(Invocation::Version) => crate::print_version("hccn-trace"),
        Err(e) => {
            let _ = writeln!(io::stderr(), "hccn-trace: {e}\n{}", USAGE.lines().next().unwrap_or_default());
            2
        }
        Ok(Invocation::Run(o)) => match run(&o) {
            Ok(()) => 0,
            Err(msg) => {
                let _ = writeln!(io::stderr(), "hccn-trace: {msg}");
                1
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_and_options_in_any_order() {
        let a = Args::new(["--summary", "dir", "--heatmap", "h.png"]);
        let Ok(Invocation::Run(o)) = parse(a) else { panic!("should parse") };
        assert_eq!((o.dir, o.heatmap, o.summary), ("dir".into(), Some("h.png".into()), true));
        assert!(parse(Args::new(["a", "b"])).is_err());
        assert!(parse(Args::new(["--summary"])).is_err());
        let Ok(Invocation::Run(o)) = parse(Args::new(["d"])) else { panic!("should parse") };
        assert!(o.summary, "summary is the default action");
    }
}
