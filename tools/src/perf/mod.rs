//! hccn-perf: an nccl-tests style sweep over message sizes for one collective, reporting time,
//! algorithm and bus bandwidth and, with `-c`, the number of wrong result elements.

mod check;

use std::io::{self, Write};
use std::time::{Duration, Instant};

use hccn_runtime::tuning::AlgoChoice;
use std::sync::Arc;

use hccn_runtime::backend::{DeviceBuffer, DeviceMemory};
use hccn_runtime::mem::SharedBuf;
use hccn_runtime::{BackendComm, BackendKind, Communicator, DataType, Op, Ptr, ReduceOp};

use crate::args::{self, Args, UsageError};
pub use check::Checker;

pub const USAGE: &str = "\
usage: hccnrun -n N hccn-perf [options]

Times one collective over a range of message sizes, like nccl-tests; rank 0 prints the table.

  --op NAME            allreduce (default), allgather, reduce_scatter, broadcast, reduce, alltoall
  --dtype NAME         int8 int16 int32 int64 uint8 uint16 uint32 uint64 fp16 bf16 fp32 (default) fp64
  --redop NAME         sum (default), prod, max, min, avg
  -b, --minbytes SIZE  smallest size (default 32M); K, M, G suffixes are powers of 1024
  -e, --maxbytes SIZE  largest size (default 32M)
  -f, --stepfactor F   multiply the size by F between steps (default 2)
  -w, --warmup N       untimed iterations per size (default 5)
  -n, --iters N        timed iterations per size (default 20)
  --reps N             timed runs of those iterations per size, the median reported, each run
                       timed by its slowest rank (default 1)
  -c, --check          verify the results and count wrong elements
  --root R             root of broadcast and reduce (default 0)
  --algo NAME          allreduce algorithm: auto (the cost model, default: HCCN_ALGO), ring,
                       rhd, tree, hier; only allreduce has a choice
  -R, --register       buffers from hccn_mem_alloc (shareable memory that same-host peers read
                       with plain loads) instead of the heap (read with process_vm_readv)
  -h, --help           this text

The size column is the op's largest buffer: allreduce, broadcast, reduce: count elements;
allgather: the gathered result; reduce_scatter: the input; alltoall: either buffer. Sizes are
rounded down to whole elements (times the ranks where the op splits by rank). busbw is algbw
times 2(n-1)/n for allreduce, (n-1)/n for allgather, reduce_scatter and alltoall, 1 otherwise.
The header names the link costs of the runtime's cost model (latency:bandwidth per transport,
see HCCN_LINK_COST) and the algorithm and pipeline chunk it picks for each size.
Exits 1 when an operation fails or a result is wrong.
";

/// The collectives hccn-perf can time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
}

/// Buffer sizes of one step, in elements. `count` is the per-call count argument (per rank
/// for the ops that split by rank), as the count column of nccl-tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub count: u64,
    pub send_elems: u64,
    pub recv_elems: u64,
    /// The size column: bytes of the op's largest buffer.
    pub bytes: u64,
}

impl Coll {
    pub const ALL: [Coll; 6] =
        [Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::Broadcast, Coll::Reduce, Coll::AllToAll];

    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "allreduce",
            Coll::AllGather => "allgather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "alltoall",
        }
    }

    pub fn from_name(name: &str) -> Option<Coll> {
        let squashed = name.to_ascii_lowercase().replace(['_', '-'], "");
        Coll::ALL.into_iter().find(|c| c.name().replace('_', "") == squashed)
    }

    fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// The smallest size (bytes) that gives a step: one element, per rank where the op splits
    /// its buffer by rank.
    pub fn min_size(self, elem_size: u64, nranks: u32) -> u64 {
        match self {
            Coll::AllReduce | Coll::Reduce | Coll::Broadcast => elem_size,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => elem_size * u64::from(nranks),
        }
    }

    /// busbw / algbw, as nccl-tests defines it.
    pub fn bus_factor(self, nranks: u32) -> f64 {
        let n = f64::from(nranks);
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce => 1.0,
        }
    }

    /// Buffers for a step of `size` bytes, or `None` when that is less than one element (per
    /// rank, for the ops that split by rank).
    pub fn layout(self, size: u64, elem_size: u64, nranks: u32) -> Option<Layout> {
        let n = u64::from(nranks);
        let (count, send, recv) = match self {
            Coll::AllReduce | Coll::Reduce => {
                let c = size / elem_size;
                (c, c, c)
            }
            Coll::Broadcast => (size / elem_size, 0, size / elem_size),
            Coll::AllGather => {
                let c = size / elem_size / n;
                (c, c, c * n)
            }
            Coll::ReduceScatter => {
                let c = size / elem_size / n;
                (c, c * n, c)
            }
            Coll::AllToAll => {
                let c = size / elem_size / n;
                (c, c * n, c * n)
            }
        };
        (count > 0).then(|| Layout { count, send_elems: send, recv_elems: recv, bytes: send.max(recv) * elem_size })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub coll: Coll,
    pub dt: DataType,
    pub op: ReduceOp,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub step_factor: u64,
    pub warmup: u32,
    pub iters: u32,
    /// `--reps`: timed runs per size; the median is reported.
    pub reps: u32,
    pub check: bool,
    pub root: u32,
    /// `--algo`; `None` keeps HCCN_ALGO.
    pub algo: Option<AlgoChoice>,
    /// `-R`: buffers from `hccn_mem_alloc`.
    pub register: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            coll: Coll::AllReduce,
            dt: DataType::Fp32,
            op: ReduceOp::Sum,
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_factor: 2,
            warmup: 5,
            iters: 20,
            reps: 1,
            check: false,
            root: 0,
            algo: None,
            register: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Invocation {
    Run(Options),
    Help,
}

fn reduce_op(name: &str) -> Option<ReduceOp> {
    ReduceOp::ALL.into_iter().find(|o| o.name() == name.to_ascii_lowercase())
}

pub fn parse(mut a: Args) -> Result<Invocation, UsageError> {
    let mut o = Options::default();
    while let Some((name, inline)) = a.next_option()? {
        let bad = |what: &str, v: &str| UsageError(format!("{name}: unknown {what} {v:?}"));
        match name.as_str() {
            "-h" | "--help" => return Ok(Invocation::Help),
            "-c" | "--check" => o.check = true,
            "-R" | "--register" => o.register = true,
            "--op" => {
                let v = a.value(&name, inline)?;
                o.coll = Coll::from_name(&v).ok_or_else(|| bad("collective", &v))?;
            }
            "--dtype" | "-d" => {
                let v = a.value(&name, inline)?;
                o.dt = DataType::from_name(&v).ok_or_else(|| bad("data type", &v))?;
            }
            "--redop" | "-o" => {
                let v = a.value(&name, inline)?;
                o.op = reduce_op(&v).ok_or_else(|| bad("reduce op", &v))?;
            }
            "-b" | "--minbytes" => o.min_bytes = args::bytes(&name, &a.value(&name, inline)?)?,
            "-e" | "--maxbytes" => o.max_bytes = args::bytes(&name, &a.value(&name, inline)?)?,
            "-f" | "--stepfactor" => o.step_factor = args::number(&name, &a.value(&name, inline)?)?,
            "-w" | "--warmup" => o.warmup = args::number(&name, &a.value(&name, inline)?)?,
            "-n" | "--iters" => o.iters = args::number(&name, &a.value(&name, inline)?)?,
            "--reps" => o.reps = args::number(&name, &a.value(&name, inline)?)?,
            "--root" | "-r" => o.root = args::number(&name, &a.value(&name, inline)?)?,
            "--algo" | "-a" => {
                let v = a.value(&name, inline)?;
                o.algo = Some(AlgoChoice::from_name(&v).ok_or_else(|| {
                    UsageError(format!("{name}: unknown algorithm {v:?} (one of {})", AlgoChoice::names().join(", ")))
                })?);
            }
            _ => return Err(UsageError(format!("unknown option {name}"))),
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

/// A buffer of one size step: on the native backend from the heap, or shareable memory (`-R`);
/// on another backend its device memory, filled and read through host copies.
enum Buf {
    Host(Box<dyn std::ops::DerefMut<Target = [u8]>>),
    Device(DeviceBuffer),
}

impl Buf {
    fn ptr(&mut self) -> Ptr {
        match self {
            Buf::Host(b) => Ptr::from_mut(b.as_mut_ptr()),
            Buf::Device(d) => d.ptr(),
        }
    }

    fn fill(&mut self, checker: &Checker) -> hccn_runtime::Result<()> {
        match self {
            Buf::Host(b) => checker.fill(b),
            Buf::Device(d) => {
                let mut host = vec![0u8; d.len()];
                checker.fill(&mut host);
                d.upload(&host)?;
            }
        }
        Ok(())
    }

    fn wrong(&self, checker: &Checker, count: usize) -> hccn_runtime::Result<u64> {
        Ok(match self {
            Buf::Host(b) => checker.wrong(b, count),
            Buf::Device(d) => {
                let mut host = vec![0u8; d.len()];
                d.download(&mut host)?;
                checker.wrong(&host, count)
            }
        })
    }
}

/// The buffers of one size step and the operation over them.
struct Step {
    send: Buf,
    recv: Buf,
    layout: Layout,
}

impl Step {
    fn new(
        o: &Options,
        layout: Layout,
        checker: &Checker,
        device: Option<&Arc<dyn DeviceMemory>>,
    ) -> Result<Step, String> {
        let es = o.dt.size();
        let alloc = |elems: u64| -> Result<Buf, String> {
            let bytes = usize::try_from(elems)
                .ok()
                .and_then(|e| e.checked_mul(es))
                .ok_or_else(|| format!("{} bytes do not fit in memory", layout.bytes))?;
            Ok(match (device, o.register) {
                (Some(m), _) => Buf::Device(DeviceBuffer::new(m.clone(), bytes).map_err(|e| e.to_string())?),
                (None, true) => Buf::Host(Box::new(SharedBuf::new(bytes).map_err(|e| e.to_string())?)),
                (None, false) => Buf::Host(Box::new(vec![0u8; bytes])),
            })
        };
        let mut step = Step { send: alloc(layout.send_elems)?, recv: alloc(layout.recv_elems)?, layout };
        step.send.fill(checker).map_err(|e| e.to_string())?;
        if o.coll == Coll::Broadcast {
            // Broadcast works in place: the root's buffer is the source.
            step.recv.fill(checker).map_err(|e| e.to_string())?;
        }
        Ok(step)
    }

    fn run(&mut self, o: &Options, comm: &dyn BackendComm) -> hccn_runtime::Result<()> {
        let send = self.send.ptr();
        let recv = self.recv.ptr();
        let (count, dt, op, root) = (self.layout.count, o.dt, o.op, o.root);
        let op = match o.coll {
            Coll::AllReduce => Op::AllReduce { send, recv, count, dt, op },
            Coll::Reduce => Op::Reduce { send, recv, count, dt, op, root },
            Coll::Broadcast => Op::Broadcast { buf: recv, count, dt, root },
            Coll::AllGather => Op::AllGather { send, recv, send_count: count, dt },
            Coll::ReduceScatter => Op::ReduceScatter { send, recv, recv_count: count, dt, op },
            Coll::AllToAll => Op::AllToAll { send, recv, count_per_rank: count, dt },
        };
        // SAFETY: `send` and `recv` are owned by `self`, memory of the communicator's backend,
        // sized by `Coll::layout` for exactly this op and count, and outlive the call, which
        // blocks until done (no stream).
        unsafe { comm.submit(op, None) }
    }
}

fn header(o: &Options, nranks: u32) -> Vec<String> {
    vec![
        format!(
            "# hccn-perf  op: {}  dtype: {}  redop: {}  root: {}  nranks: {nranks}",
            o.coll.name(),
            o.dt.name(),
            if o.coll.reduces() { o.op.name() } else { "none" },
            if o.coll.rooted() { o.root.to_string() } else { "-".into() },
        ),
        format!(
            "# minBytes: {}  maxBytes: {}  step: {}(factor)  warmup iters: {}  iters: {}  reps: {}  validation: {}",
            o.min_bytes,
            o.max_bytes,
            o.step_factor,
            o.warmup,
            o.iters,
            o.reps,
            u8::from(o.check)
        ),
        "#".into(),
        format!(
            "#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>10}  {:>8}  {:>8}  {:>7}",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"
        ),
        format!(
            "#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>10}  {:>8}  {:>8}  {:>7}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""
        )
        .trim_end()
        .to_owned(),
    ]
}

/// The sizes of the sweep with their buffers (`None`: too small for one element), or an error
/// when no size of the range gives a row, so that an empty table never reads as a pass.
fn steps(o: &Options, n: u32) -> Result<Vec<(u64, Option<Layout>)>, String> {
    let es = o.dt.size() as u64;
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
            o.dt.name(),
            o.coll.name()
        ));
    }
    Ok(steps)
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
    let (me, n) = (comm.rank(), comm.size());
    if o.coll.rooted() && o.root >= n {
        return Err(format!("--root {} is not a rank of this {n}-rank job", o.root));
    }
    // Takes the description by reference: the timed loop must not allocate per operation.
    let failed = |what: &str, e: hccn_runtime::Error| format!("rank {me}: {what} failed: {e}");
    let checker = Checker::new(o.coll, o.dt, o.op, me, n, o.root);
    if me == 0 {
        header(o, n).iter().for_each(|l| emit(l));
        emit(&format!("# link costs: {}", comm.link_costs()));
        if comm.link_costs().shared_cores {
            emit("# ranks outnumber cores on rank 0's host");
        }
    }
    let steps = steps(o, n)?;
    let started = Instant::now();
    let (mut busbw_sum, mut rows, mut total_wrong) = (0.0, 0u32, 0u64);
    for (size, layout) in steps {
        let Some(layout) = layout else {
            if me == 0 {
                let unit = if o.coll.min_size(1, n) > 1 { format!(" per rank of {n}") } else { String::new() };
                emit(&format!("# {size} bytes: skipped, less than one {}{unit}", o.dt.name()));
            }
            continue;
        };
        let what = format!("{} of {} bytes", o.coll.name(), layout.bytes);
        let plan = comm.plan(o.coll.name(), layout.bytes as usize).map_err(|e| format!("rank {me}: {what}: {e}"))?;
        if me == 0 {
            if let Some((algo, chunk)) = plan {
                emit(&format!("# {} bytes: algorithm {algo}, chunk {chunk}", layout.bytes));
            }
        }
        let mut step =
            Step::new(o, layout, &checker, device.as_ref()).map_err(|e| format!("rank {me}: {what}: {e}"))?;
        for _ in 0..o.warmup {
            step.run(o, joined.as_ref()).map_err(|e| failed(&what, e))?;
        }
        let mut runs = Vec::with_capacity(o.reps as usize);
        for _ in 0..o.reps {
            barrier(comm).map_err(|e| failed(&format!("barrier before {what}"), e))?;
            let t0 = Instant::now();
            for _ in 0..o.iters {
                step.run(o, joined.as_ref()).map_err(|e| failed(&what, e))?;
            }
            let local_us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(o.iters);
            runs.push(max_over_ranks(comm, local_us).map_err(|e| failed("time reduction", e))?);
        }
        runs.sort_by(f64::total_cmp);
        let us = runs[runs.len() / 2];
        let wrong = if o.check {
            let mine = step.recv.wrong(&checker, layout.count as usize).map_err(|e| failed("reading the result", e))?;
            Some(sum_over_ranks(comm, mine).map_err(|e| failed("wrong-count reduction", e))?)
        } else {
            None
        };
        total_wrong += wrong.unwrap_or(0);
        let algbw = layout.bytes as f64 / (us * 1e3);
        let busbw = algbw * o.coll.bus_factor(n);
        busbw_sum += busbw;
        rows += 1;
        if me == 0 {
            emit(&format!(
                "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {:>10.2}  {:>8.2}  {:>8.2}  {:>7}",
                layout.bytes,
                layout.count,
                o.dt.name(),
                if o.coll.reduces() { o.op.name() } else { "none" },
                if o.coll.rooted() { i64::from(o.root) } else { -1 },
                us,
                algbw,
                busbw,
                wrong.map_or("N/A".into(), |w| w.to_string()),
            ));
            if started.elapsed() > Duration::from_secs(1) {
                let _ = writeln!(io::stderr(), "hccn-perf: {} bytes done", layout.bytes);
            }
        }
    }
    if me == 0 {
        if o.check {
            emit(&format!("# Wrong elements       : {total_wrong} {}", if total_wrong == 0 { "OK" } else { "FAILED" }));
        }
        let avg = if rows > 0 { busbw_sum / f64::from(rows) } else { 0.0 };
        emit(&format!("# Avg bus bandwidth    : {avg:.4}"));
        emit("#");
    }
    if total_wrong > 0 && me == 0 {
        let _ = writeln!(io::stderr(), "hccn-perf: {total_wrong} wrong elements");
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
    fn layouts_follow_nccl_tests() {
        let l = |c: Coll, size| c.layout(size, 4, 4);
        assert_eq!(l(Coll::AllReduce, 100), Some(Layout { count: 25, send_elems: 25, recv_elems: 25, bytes: 100 }));
        assert_eq!(l(Coll::AllGather, 100), Some(Layout { count: 6, send_elems: 6, recv_elems: 24, bytes: 96 }));
        assert_eq!(l(Coll::ReduceScatter, 64), Some(Layout { count: 4, send_elems: 16, recv_elems: 4, bytes: 64 }));
        assert_eq!(l(Coll::AllToAll, 64), Some(Layout { count: 4, send_elems: 16, recv_elems: 16, bytes: 64 }));
        assert_eq!(l(Coll::Broadcast, 8), Some(Layout { count: 2, send_elems: 0, recv_elems: 2, bytes: 8 }));
        assert_eq!(l(Coll::AllGather, 8), None, "8 bytes is not one fp32 per rank of 4");
        assert_eq!(l(Coll::Reduce, 3), None);
        for c in Coll::ALL {
            let least = c.min_size(4, 3);
            assert!(c.layout(least, 4, 3).is_some() && c.layout(least - 1, 4, 3).is_none(), "{}", c.name());
        }
        assert!((Coll::AllReduce.bus_factor(4) - 1.5).abs() < 1e-12);
        assert!((Coll::AllGather.bus_factor(4) - 0.75).abs() < 1e-12);
    }

    #[test]
    fn a_range_without_rows_is_an_error_naming_the_least_size() {
        let o = Options { coll: Coll::ReduceScatter, min_bytes: 10, max_bytes: 10, ..Options::default() };
        let e = steps(&o, 3).err().unwrap_or_default();
        assert!(e.contains("10 .. 10 bytes") && e.contains("-b 12"), "{e}");
        let o = Options { min_bytes: 8, max_bytes: 64, step_factor: 2, ..o };
        let s = steps(&o, 3).unwrap_or_default();
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
            (o.coll, o.dt, o.min_bytes, o.max_bytes, o.step_factor, o.check, o.register),
            (Coll::ReduceScatter, DataType::Bf16, 8, 64 << 20, 4, true, true)
        );
        assert_eq!(Coll::from_name("all_reduce"), Some(Coll::AllReduce));
        assert_eq!(Coll::from_name("AllToAll"), Some(Coll::AllToAll));
        assert!(p(&["--op", "scan"]).is_err());
        assert!(p(&["-b", "1M", "-e", "1K"]).is_err());
        assert!(p(&["-f", "1"]).is_err());
        assert!(p(&["-n", "0"]).is_err());
        assert!(p(&["--reps", "0"]).is_err());
        let Ok(Invocation::Run(o)) = p(&["--reps", "3", "-r", "2"]) else { panic!("not parsed") };
        assert_eq!((o.reps, o.root, Options::default().reps), (3, 2, 1));
        assert!(p(&["stray"]).is_err());
        assert_eq!(p(&["-h"]), Ok(Invocation::Help));
        let Ok(Invocation::Run(o)) = p(&["--algo", "rhd"]) else { panic!("not parsed") };
        assert_eq!(o.algo, Some(AlgoChoice::Rhd));
        assert!(p(&["--algo", "bogus"]).is_err());
        assert!(p(&["--op", "broadcast", "--algo", "ring"]).is_err(), "only allreduce has a choice");
    }
}
