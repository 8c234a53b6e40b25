//! hccn-perf: an nccl-tests style sweep over message sizes for one collective, reporting time,
//! algorithm and bus bandwidth out of place and in place and, with `-c`, the number of wrong
//! result elements; every data type and reduce op with `-d all` and `-o all`.

mod check;
mod coll;
mod report;
mod step;

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hccn_runtime::tuning::AlgoChoice;
use std::sync::Arc;

use hccn_runtime::backend::DeviceMemory;
use hccn_runtime::{BackendComm, BackendKind, Communicator, DataType, Op, ReduceOp};

use crate::args::{self, Args, UsageError};
pub use check::Checker;
pub use coll::{Coll, Layout};
use report::{Cell, Format, IterStats, Row};
use step::{Kind, Step};

pub const USAGE: &str = "\
usage: hccnrun -n N hccn-perf [options]

Times one collective over a range of message sizes, like nccl-tests; rank 0 prints the table:
each size out of place and in place, side by side.

  --op NAME            allreduce (default), allgather, reduce_scatter, broadcast, reduce,
                       alltoall, gather, scatter, sendrecv
  -d, --dtype NAME     int8 int16 int32 int64 uint8 uint16 uint32 uint64 fp16 bf16 fp32 (default)
                       fp64, or all: each in turn
  -o, --redop NAME     sum (default), prod, max, min, avg, or all: each in turn (reducing ops)
  -r, --root R         root of broadcast, reduce, gather and scatter (default 0), or all
  -b, --minbytes SIZE  smallest size (default 32M); K, M, G suffixes are powers of 1024
  -e, --maxbytes SIZE  largest size (default 32M)
  -f, --stepfactor F   multiply the size by F between steps (default 2)
  -w, --warmup N       untimed iterations per size (default 5)
  -n, --iters N        timed iterations per size (default 20)
  --reps N             timed runs of those iterations per size, the median reported, each run
                       timed by its slowest rank (default 1)
  -c, --check          verify the results and count wrong elements (after the timed runs, one
                       more run on fresh inputs, in each placement)
  --place both|out|in  which columns to measure (default both); the other shows N/A
  -I, --per-iter-timing 0|1
                       1: time every iteration (by its slowest rank) and add, per column, its
                       minimum, maximum, 99th percentile and coefficient of variation
  -J, --output-file FILE
                       also write the results to FILE: JSON (FILE.json) or CSV (FILE.csv)
  --algo NAME          allreduce algorithm: auto (the cost model, default: HCCN_ALGO), ring,
                       rhd, tree, hier; only allreduce has a choice
  -R, --register       buffers from hccn_mem_alloc (shareable memory that same-host peers read
                       with plain loads) instead of the heap (read with process_vm_readv)
  --version            hccn-perf's version
  -h, --help           this text

The size column is the op's largest buffer: allreduce, broadcast, reduce, sendrecv: count
elements; allgather, gather: the gathered result; reduce_scatter, scatter: the input; alltoall:
either buffer. Sizes are rounded down to whole elements (times the ranks where the op splits by
rank). busbw is algbw times 2(n-1)/n for allreduce, (n-1)/n for allgather, reduce_scatter,
alltoall, gather and scatter, 1 otherwise. In place, as nccl-tests places it: one buffer for
send and receive (allgather and gather read the rank's own block of the result, reduce_scatter
and scatter write the rank's own block of the input); alltoall and sendrecv have no in-place
form and broadcast no out-of-place one (N/A). sendrecv: each rank sends to rank+1 and receives
from rank-1; even ranks send first (hccn's send and receive are separate blocking calls).
The header names the link costs of the runtime's cost model (latency:bandwidth per transport,
see HCCN_LINK_COST) and the algorithm and pipeline chunk it picks for each size.
Exits 1 when an operation fails or a result is wrong.
";

/// Which placements are measured (`--place`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Both,
    OutOfPlace,
    InPlace,
}

/// `--root`: one root, or each rank in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    One(u32),
    All,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub coll: Coll,
    /// `-d`: the data types, in turn.
    pub dtypes: Vec<DataType>,
    /// `-o`: the reduce ops, in turn (reducing collectives).
    pub ops: Vec<ReduceOp>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub step_factor: u64,
    pub warmup: u32,
    pub iters: u32,
    /// `--reps`: timed runs per size; the median is reported.
    pub reps: u32,
    pub check: bool,
    pub root: Root,
    pub place: Place,
    /// `-I 1`: per-iteration timing.
    pub per_iter: bool,
    /// `-J`: the results file and its format.
    pub output: Option<(PathBuf, Format)>,
    /// `--algo`; `None` keeps HCCN_ALGO.
    pub algo: Option<AlgoChoice>,
    /// `-R`: buffers from `hccn_mem_alloc`.
    pub register: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            coll: Coll::AllReduce,
            dtypes: vec![DataType::Fp32],
            ops: vec![ReduceOp::Sum],
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_factor: 2,
            warmup: 5,
            iters: 20,
            reps: 1,
            check: false,
            root: Root::One(0),
            place: Place::Both,
            per_iter: false,
            output: None,
            algo: None,
            register: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Invocation {
    Run(Options),
    Help,
    Version,
}

fn reduce_op(name: &str) -> Option<ReduceOp> {
    ReduceOp::ALL.into_iter().find(|o| o.name() == name.to_ascii_lowercase())
}

/// `NAME` or `all`, through `one` (which names a single choice).
fn one_or_all<T: Copy>(v: &str, all: &[T], one: impl Fn(&str) -> Option<T>) -> Option<Vec<T>> {
    if v.eq_ignore_ascii_case("all") {
        return Some(all.to_vec());
    }
    one(v).map(|x| vec![x])
}

/// Takes one option into `o`; `Some` when it ends parsing (help, version).
fn take(o: &mut Options, a: &mut Args, name: &str, inline: Option<String>) -> Result<Option<Invocation>, UsageError> {
    let bad = |what: &str, v: &str| UsageError(format!("{name}: unknown {what} {v:?}"));
    let mut value = || a.value(name, inline.clone());
    match name {
        "-h" | "--help" => return Ok(Some(Invocation::Help)),
        "--version" => return Ok(Some(Invocation::Version)),
        "-c" | "--check" => o.check = true,
        "-R" | "--register" => o.register = true,
        "--op" => {
            let v = value()?;
            o.coll = Coll::from_name(&v).ok_or_else(|| bad("collective", &v))?;
        }
        "--dtype" | "-d" => {
            let v = value()?;
            o.dtypes = one_or_all(&v, &DataType::ALL, DataType::from_name).ok_or_else(|| bad("data type", &v))?;
        }
        "--redop" | "-o" => {
            let v = value()?;
            o.ops = one_or_all(&v, &ReduceOp::ALL, reduce_op).ok_or_else(|| bad("reduce op", &v))?;
        }
        "-b" | "--minbytes" => o.min_bytes = args::bytes(name, &value()?)?,
        "-e" | "--maxbytes" => o.max_bytes = args::bytes(name, &value()?)?,
        "-f" | "--stepfactor" => o.step_factor = args::number(name, &value()?)?,
        "-w" | "--warmup" | "--warmup_iters" => o.warmup = args::number(name, &value()?)?,
        "-n" | "--iters" => o.iters = args::number(name, &value()?)?,
        "--reps" => o.reps = args::number(name, &value()?)?,
        "--root" | "-r" => {
            let v = value()?;
            o.root = if v.eq_ignore_ascii_case("all") { Root::All } else { Root::One(args::number(name, &v)?) };
        }
        "--place" => {
            o.place = match value()?.as_str() {
                "both" => Place::Both,
                "out" => Place::OutOfPlace,
                "in" => Place::InPlace,
                v => return Err(UsageError(format!("--place {v}: expected both, out or in"))),
            }
        }
        "-I" | "--per-iter-timing" | "--per_iter_timing" => {
            o.per_iter = match value()?.as_str() {
                "0" => false,
                "1" => true,
                v => return Err(UsageError(format!("{name} {v}: expected 0 or 1"))),
            }
        }
        "-J" | "--output-file" | "--output_file" => {
            let path = PathBuf::from(value()?);
            let format = Format::of(&path)
                .ok_or_else(|| UsageError(format!("{name} {}: the file must end in .json or .csv", path.display())))?;
            o.output = Some((path, format));
        }
        "--algo" | "-a" => {
            let v = value()?;
            o.algo = Some(AlgoChoice::from_name(&v).ok_or_else(|| {
                UsageError(format!("{name}: unknown algorithm {v:?} (one of {})", AlgoChoice::names().join(", ")))
            })?);
        }
        _ => return Err(UsageError(format!("unknown option {name}"))),
    }
    Ok(None)
}

pub fn parse(mut a: Args) -> Result<Invocation, UsageError> {
    let mut o = Options::default();
    while let Some((name, inline)) = a.next_option()? {
        if let Some(done) = take(&mut o, &mut a, &name, inline)? {
            return Ok(done);
        }
    }
    if let Some(extra) = a.rest().first() {
        return Err(UsageError(format!("unexpected argument {extra:?}")));
    }
    if o.min_bytes == 0 || o.min_bytes > o.max_bytes {
        return Err(UsageError(format!(
            "sizes must satisfy 0 < minbytes ({}) <= maxbytes ({})",
            o.min_bytes, o.max_bytes
        )));
    }
    if o.step_factor < 2 {
        return Err(UsageError("the step factor must be at least 2".into()));
    }
    if o.algo.is_some_and(|a| a != AlgoChoice::Auto) && o.coll != Coll::AllReduce {
        return Err(UsageError(format!("--algo applies to allreduce only, not {}", o.coll.name())));
    }
    if o.iters == 0 {
        return Err(UsageError("at least one timed iteration (-n) is needed".into()));
    }
    if o.reps == 0 {
        return Err(UsageError("at least one timed run (--reps) is needed".into()));
    }
    Ok(Invocation::Run(o))
}

/// The sizes of the sweep: min, min*f, min*f^2, ... up to max.
pub fn sizes(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut s = min;
    while s <= max {
        out.push(s);
        match s.checked_mul(factor) {
            Some(next) if next > s => s = next,
            _ => break,
        }
    }
    out
}

/// hccn-perf's entry point; returns the process exit code.
pub fn main() -> i32 {
    match parse(Args::from_env()) {
        Ok(Invocation::Help) => {
            let _ = io::stdout().write_all(USAGE.as_bytes());
            0
        }
        Ok(Invocation::Version) => crate::print_version("hccn-perf"),
        Err(e) => {
            let first = USAGE.lines().next().unwrap_or_default();
            let _ = writeln!(io::stderr(), "hccn-perf: {e}\n{first}\n(hccn-perf --help for more)");
            2
        }
        Ok(Invocation::Run(o)) => match run(&o) {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(msg) => {
                let _ = writeln!(io::stderr(), "hccn-perf: {msg}");
                1
            }
        },
    }
}

/// A table line on stdout, flushed so that a long sweep shows progress.
fn emit(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn barrier(comm: &Communicator) -> hccn_runtime::Result<()> {
    // SAFETY: a barrier touches no caller memory.
    unsafe { comm.submit(Op::Barrier, None) }
}

/// The largest `x` over all ranks, so that every rank reports the slowest rank's time.
fn max_over_ranks(comm: &Communicator, x: f64) -> hccn_runtime::Result<f64> {
    let mut out = [0f64];
    comm.all_reduce(&[x], &mut out, ReduceOp::Max)?;
    Ok(out[0])
}

fn sum_over_ranks(comm: &Communicator, x: u64) -> hccn_runtime::Result<u64> {
    let mut out = [0u64];
    comm.all_reduce(&[x], &mut out, ReduceOp::Sum)?;
    Ok(out[0])
}

fn preamble(o: &Options, nranks: u32) -> Vec<String> {
    let names = |v: &[&'static str]| v.join(",");
    let dtypes: Vec<&str> = o.dtypes.iter().map(|d| d.name()).collect();
    let ops: Vec<&str> = o.ops.iter().map(|r| r.name()).collect();
    let root = match o.root {
        _ if !o.coll.rooted() => "-".to_owned(),
        Root::One(r) => r.to_string(),
        Root::All => "all".to_owned(),
    };
    vec![
        format!(
            "# hccn-perf {}  op: {}  dtype: {}  redop: {}  root: {root}  nranks: {nranks}",
            env!("CARGO_PKG_VERSION"),
            o.coll.name(),
            names(&dtypes),
            if o.coll.reduces() { names(&ops) } else { "none".into() },
        ),
        format!(
            "# minBytes: {}  maxBytes: {}  step: {}(factor)  warmup iters: {}  iters: {}  reps: {}  validation: {}  per-iteration: {}",
            o.min_bytes,
            o.max_bytes,
            o.step_factor,
            o.warmup,
            o.iters,
            o.reps,
            u8::from(o.check),
            u8::from(o.per_iter)
        ),
        "#".into(),
    ]
}

/// The sizes of the sweep with their buffers (`None`: too small for one element), or an error
/// when no size of the range gives a row, so that an empty table never reads as a pass.
fn steps(o: &Options, dt: DataType, n: u32) -> Result<Vec<(u64, Option<Layout>)>, String> {
    let es = dt.size() as u64;
    let steps: Vec<_> =
        sizes(o.min_bytes, o.max_bytes, o.step_factor).into_iter().map(|s| (s, o.coll.layout(s, es, n))).collect();
    if steps.iter().all(|(_, l)| l.is_none()) {
        let least = o.coll.min_size(es, n);
        let per_rank = if least > es { format!(" per rank ({n} ranks)") } else { String::new() };
        return Err(format!(
            "no size in {} .. {} bytes holds one {} element{per_rank} for {}: nothing to measure; \
             the smallest size that does is {least} bytes (-b {least})",
            o.min_bytes,
            o.max_bytes,
            dt.name(),
            o.coll.name()
        ));
    }
    Ok(steps)
}

/// What the sweep needs besides its options: the communicator, its backend, this rank's place.
struct Ctx<'a> {
    joined: &'a dyn BackendComm,
    comm: &'a Communicator,
    device: Option<Arc<dyn DeviceMemory>>,
    me: u32,
    n: u32,
}

impl Ctx<'_> {
    fn failed(&self, what: &str, e: hccn_runtime::Error) -> String {
        format!("rank {}: {what} failed: {e}", self.me)
    }
}

/// Times `kind` on one size, in one placement; checks it with `-c`.
fn measure(o: &Options, c: &Ctx<'_>, kind: Kind, layout: Layout, in_place: bool) -> Result<Cell, String> {
    let place = if in_place { "in place" } else { "out of place" };
    let what = format!("{} of {} bytes {place}", kind.coll.name(), layout.bytes);
    let checker = Checker::new(kind.coll, kind.dt, kind.op, c.me, c.n, kind.root);
    let mut step = Step::new(kind, layout, (c.me, c.n), in_place, c.device.as_ref(), o.register)
        .map_err(|e| format!("rank {}: {what}: {e}", c.me))?;
    step.fill(&checker).map_err(|e| c.failed(&format!("filling the buffers of {what}"), e))?;
    for _ in 0..o.warmup {
        step.run(c.joined).map_err(|e| c.failed(&what, e))?;
    }
    let mut runs = Vec::with_capacity(o.reps as usize);
    let mut iter_us = Vec::new();
    for _ in 0..o.reps {
        barrier(c.comm).map_err(|e| c.failed(&format!("barrier before {what}"), e))?;
        let t0 = Instant::now();
        for _ in 0..o.iters {
            let t = Instant::now();
            step.run(c.joined).map_err(|e| c.failed(&what, e))?;
            if o.per_iter {
                iter_us.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        let local_us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(o.iters);
        runs.push(max_over_ranks(c.comm, local_us).map_err(|e| c.failed("time reduction", e))?);
    }
    runs.sort_by(f64::total_cmp);
    let us = runs[runs.len() / 2];
    let per_iter = if o.per_iter {
        // Each iteration as its slowest rank saw it.
        let mut slowest = vec![0f64; iter_us.len()];
        c.comm.all_reduce(&iter_us, &mut slowest, ReduceOp::Max).map_err(|e| c.failed("time reduction", e))?;
        IterStats::of(&slowest)
    } else {
        None
    };
    let wrong = if o.check {
        // The timed runs overwrote in-place inputs: one more run on fresh ones.
        step.fill(&checker).map_err(|e| c.failed(&format!("filling the buffers of {what}"), e))?;
        step.run(c.joined).map_err(|e| c.failed(&what, e))?;
        let mine = step.wrong(&checker).map_err(|e| c.failed("reading the result", e))?;
        Some(sum_over_ranks(c.comm, mine).map_err(|e| c.failed("wrong-count reduction", e))?)
    } else {
        None
    };
    let algbw = layout.bytes as f64 / (us * 1e3);
    Ok(Cell { us, algbw, busbw: algbw * kind.coll.bus_factor(c.n), wrong, per_iter })
}

/// The rows of one data type, reduce op and root over the sizes; `plans`: rank 0 also names
/// the algorithm and chunk the runtime picks for each size.
fn sweep(o: &Options, c: &Ctx<'_>, kind: Kind, plans: bool, rows: &mut Vec<Row>) -> Result<(), String> {
    let started = Instant::now();
    for (size, layout) in steps(o, kind.dt, c.n)? {
        let Some(layout) = layout else {
            if c.me == 0 {
                let unit = if kind.coll.min_size(1, c.n) > 1 { format!(" per rank of {}", c.n) } else { String::new() };
                emit(&format!("# {size} bytes: skipped, less than one {}{unit}", kind.dt.name()));
            }
            continue;
        };
        let plan = c.comm.plan(kind.coll.name(), layout.bytes as usize);
        let plan = plan.map_err(|e| format!("rank {}: {} of {} bytes: {e}", c.me, kind.coll.name(), layout.bytes))?;
        if let (true, 0, Some((algo, chunk))) = (plans, c.me, plan) {
            emit(&format!("# {} bytes: algorithm {algo}, chunk {chunk}", layout.bytes));
        }
        let out = o.place != Place::InPlace && kind.coll.out_of_place();
        let inp = o.place != Place::OutOfPlace && kind.coll.in_place(&layout, c.me).is_some();
        let out_of_place = if out { Some(measure(o, c, kind, layout, false)?) } else { None };
        let in_place = if inp { Some(measure(o, c, kind, layout, true)?) } else { None };
        let row = Row {
            bytes: layout.bytes,
            count: layout.count,
            dtype: kind.dt.name(),
            redop: if kind.coll.reduces() { kind.op.name() } else { "none" },
            root: if kind.coll.rooted() { i64::from(kind.root) } else { -1 },
            out_of_place,
            in_place,
        };
        if c.me == 0 {
            emit(&report::line(&row, o.per_iter));
            if started.elapsed() > Duration::from_secs(1) {
                let _ = writeln!(io::stderr(), "hccn-perf: {} {} bytes done", kind.dt.name(), layout.bytes);
            }
        }
        rows.push(row);
    }
    Ok(())
}

/// The combinations of data type, reduce op and root to sweep, in nccl-tests' order.
fn kinds(o: &Options, n: u32) -> Result<Vec<Kind>, String> {
    let roots: Vec<u32> = match o.root {
        _ if !o.coll.rooted() => vec![0],
        Root::One(r) if r >= n => return Err(format!("--root {r} is not a rank of this {n}-rank job")),
        Root::One(r) => vec![r],
        Root::All => (0..n).collect(),
    };
    let ops = if o.coll.reduces() { o.ops.clone() } else { o.ops[..1].to_vec() };
    let mut out = Vec::new();
    for &dt in &o.dtypes {
        for &op in &ops {
            out.extend(roots.iter().map(|&root| Kind { coll: o.coll, dt, op, root }));
        }
    }
    Ok(out)
}

/// Runs the sweep; `Ok(false)` when some result was wrong.
fn run(o: &Options) -> Result<bool, String> {
    let mut cfg_seen = None;
    let joined = crate::join_job_with(|cfg| {
        cfg.algo = o.algo.unwrap_or(cfg.algo);
        cfg_seen = Some(cfg.clone());
    })?;
    let cfg = cfg_seen.unwrap_or_default();
    // Buffers are the backend's memory; the native backend keeps heap buffers (or -R's).
    let device = match cfg.backend {
        BackendKind::Native => None,
        _ => Some(hccn_runtime::backend::get(&cfg).and_then(|b| b.memory(&cfg)).map_err(|e| e.to_string())?),
    };
    // Timing, barriers and the checks' sums run on the control plane, the operation on the data path.
    let comm: &Communicator = joined.control();
    let c = Ctx { joined: joined.as_ref(), comm, device, me: comm.rank(), n: comm.size() };
    if o.coll == Coll::SendRecv && c.n < 2 {
        return Err("sendrecv needs at least 2 ranks".into());
    }
    let kinds = kinds(o, c.n)?;
    if c.me == 0 {
        preamble(o, c.n).iter().for_each(|l| emit(l));
        emit(&format!("# link costs: {}", comm.link_costs()));
        if comm.link_costs().shared_cores {
            emit("# ranks outnumber cores on rank 0's host");
        }
        report::header(o.per_iter).iter().for_each(|l| emit(l));
    }
    let mut rows = Vec::new();
    for (i, &kind) in kinds.iter().enumerate() {
        sweep(o, &c, kind, i == 0, &mut rows)?;
    }
    let cells = rows.iter().flat_map(|r| [&r.out_of_place, &r.in_place]).flatten();
    let total_wrong: u64 = cells.clone().filter_map(|c| c.wrong).sum();
    let busbw: Vec<f64> = cells.map(|c| c.busbw).collect();
    let avg = if busbw.is_empty() { 0.0 } else { busbw.iter().sum::<f64>() / busbw.len() as f64 };
    if c.me == 0 {
        if o.check {
            emit(&format!("# Wrong elements       : {total_wrong} {}", if total_wrong == 0 { "OK" } else { "FAILED" }));
        }
        emit(&format!("# Avg bus bandwidth    : {avg:.3}"));
        emit("#");
        if let Some((path, format)) = &o.output {
            let text = match format {
                Format::Json => {
                    let config = serde_json::json!({
                        "tool": "hccn-perf", "version": env!("CARGO_PKG_VERSION"), "op": o.coll.name(),
                        "nranks": c.n, "min_bytes": o.min_bytes, "max_bytes": o.max_bytes,
                        "step_factor": o.step_factor, "warmup_iters": o.warmup, "iters": o.iters,
                        "reps": o.reps, "check": o.check, "per_iter_timing": o.per_iter,
                        "link_costs": comm.link_costs().to_string(),
                    });
                    let wrong = o.check.then_some(total_wrong);
                    serde_json::to_string_pretty(&report::json(config, &rows, wrong, avg)).unwrap_or_default() + "\n"
                }
                Format::Csv => report::csv(o.coll.name(), &rows, o.per_iter),
            };
            report::write(path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        if total_wrong > 0 {
            let _ = writeln!(io::stderr(), "hccn-perf: {total_wrong} wrong elements");
        }
    }
    Ok(total_wrong == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_sizes() {
        assert_eq!(sizes(8, 128, 4), vec![8, 32, 128]);
        assert_eq!(sizes(8, 100, 2), vec![8, 16, 32, 64]);
        assert_eq!(sizes(5, 5, 2), vec![5]);
        assert_eq!(sizes(u64::MAX / 2, u64::MAX, 4), vec![u64::MAX / 2]);
    }

    #[test]
    fn a_range_without_rows_is_an_error_naming_the_least_size() {
        let o = Options { coll: Coll::ReduceScatter, min_bytes: 10, max_bytes: 10, ..Options::default() };
        let e = steps(&o, DataType::Fp32, 3).err().unwrap_or_default();
        assert!(e.contains("10 .. 10 bytes") && e.contains("-b 12"), "{e}");
        let o = Options { min_bytes: 8, max_bytes: 64, step_factor: 2, ..o };
        let s = steps(&o, DataType::Fp32, 3).unwrap_or_default();
        assert_eq!(
            s.iter().map(|(b, l)| (*b, l.is_some())).collect::<Vec<_>>(),
            [(8, false), (16, true), (32, true), (64, true)]
        );
    }

    #[test]
    fn parses_options() {
        let p = |a: &[&str]| parse(Args::new(a.iter().copied()));
        let Ok(Invocation::Run(o)) =
            p(&["--op", "reduce_scatter", "--dtype=bf16", "-b", "8", "-e", "64M", "-f", "4", "-c", "-R"])
        else {
            panic!("not parsed")
        };
        assert_eq!(
            (o.coll, o.dtypes.as_slice(), o.min_bytes, o.max_bytes, o.step_factor, o.check, o.register),
            (Coll::ReduceScatter, &[DataType::Bf16][..], 8, 64 << 20, 4, true, true)
        );
        assert_eq!(Coll::from_name("all_reduce"), Some(Coll::AllReduce));
        assert_eq!(Coll::from_name("AllToAll"), Some(Coll::AllToAll));
        assert!(p(&["--op", "scan"]).is_err());
        assert!(p(&["-b", "1M", "-e", "1K"]).is_err());
        assert!(p(&["-f", "1"]).is_err());
        assert!(p(&["-n", "0"]).is_err());
        assert!(p(&["--reps", "0"]).is_err());
        let Ok(Invocation::Run(o)) = p(&["--reps", "3", "-r", "2"]) else { panic!("not parsed") };
        assert_eq!((o.reps, o.root, Options::default().reps), (3, Root::One(2), 1));
        assert!(p(&["stray"]).is_err());
        assert_eq!(p(&["-h"]), Ok(Invocation::Help));
        let Ok(Invocation::Run(o)) = p(&["--algo", "rhd"]) else { panic!("not parsed") };
        assert_eq!(o.algo, Some(AlgoChoice::Rhd));
        assert!(p(&["--algo", "bogus"]).is_err());
        assert!(p(&["--op", "broadcast", "--algo", "ring"]).is_err(), "only allreduce has a choice");
    }

    #[test]
    fn every_type_op_and_root_in_nccl_tests_order() {
        let p = |a: &[&str]| match parse(Args::new(a.iter().copied())) {
            Ok(Invocation::Run(o)) => o,
            other => panic!("{a:?}: {other:?}"),
        };
        let o = p(&["-d", "all", "-o", "all", "-I", "1", "-J", "out.csv", "--place", "in", "--op", "sendrecv"]);
        assert_eq!((o.dtypes.len(), o.ops.len(), o.per_iter, o.place), (12, 5, true, Place::InPlace));
        assert_eq!(o.output, Some((PathBuf::from("out.csv"), Format::Csv)));
        assert_eq!(kinds(&o, 3).map(|k| k.len()), Ok(12), "sendrecv reduces nothing: one op per type");
        let o = p(&["--op", "reduce", "-d", "all", "-o", "all", "-r", "all"]);
        let k = kinds(&o, 2).expect("kinds");
        assert_eq!(k.len(), 12 * 5 * 2);
        assert_eq!(
            (k[0].dt, k[0].op, k[0].root, k[1].root, k[2].op),
            (DataType::Int8, ReduceOp::Sum, 0, 1, ReduceOp::Prod)
        );
        assert!(kinds(&p(&["--op", "gather", "-r", "3"]), 3).is_err());
        for bad in [&["-d", "every"][..], &["-I", "2"], &["-J", "out.txt"], &["--place", "none"]] {
            assert!(parse(Args::new(bad.iter().copied())).is_err(), "{bad:?}");
        }
    }
}
