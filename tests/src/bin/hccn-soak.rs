//! Soak: `hccn-soak OPS [SEED]` under `hccnrun -n 4` runs OPS random collectives (operation,
//! data type, reduce op, size up to 4 MiB per buffer, root, communicator among the world and
//! two groups, blocking or on a stream with a stream or event wait) with random small delays, and
//! checks every result exactly against the fixture. Each rank samples its VmRSS (after
//! malloc_trim) and open descriptors every 100 operations and prints them on its `SOAK` line (read by tests/tests/soak.rs
//! and benches/soak.sh).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use hccn_runtime::{Communicator, DataType, Event, Op, Ptr, ReduceOp, Stream};
use hccn_tests::fixture;

/// Largest buffer of one rank, in bytes.
const MAX_BYTES: usize = 4 << 20;
const SENTINEL: u8 = 0x5a;

/// xorshift64*: the same sequence on every rank for the shared choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// VmRSS (KiB) and open descriptors. Freed heap is returned to the system first, so that RSS
/// measures what is live rather than what the allocator keeps cached from the last large buffer.
fn sample() -> (u64, usize) {
    // SAFETY: malloc_trim only releases free memory of glibc's heap.
    unsafe { libc::malloc_trim(0) };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Minus the descriptor read_dir itself holds.
    let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count().saturating_sub(1)).unwrap_or(0);
    (rss, fds)
}

/// The fixture's inputs and results repeat every 15 elements (inputs are formulas of j mod 3 or
/// mod 5), so long buffers are made by repeating 15 elements instead of encoding each one.
fn periodic(one: impl Fn(usize, usize) -> Vec<u8>, dt: DataType, offset: usize, count: usize) -> Vec<u8> {
    let es = dt.size();
    let base = offset % 15;
    let period = one(base, 15);
    let mut out = Vec::with_capacity(count * es);
    while out.len() < count * es {
        let take = (count * es - out.len()).min(period.len());
        out.extend_from_slice(&period[..take]);
    }
    out
}

fn fill(dt: DataType, op: ReduceOp, rank: u32, offset: usize, count: usize) -> Vec<u8> {
    periodic(|o, c| fixture::fill(dt, op, rank, o, c), dt, offset, count)
}

fn reduced(dt: DataType, op: ReduceOp, ranks: &[u32], offset: usize, count: usize) -> Vec<u8> {
    periodic(|o, c| fixture::reduced_block(dt, op, ranks, o, c), dt, offset, count)
}

fn p(b: &[u8]) -> Ptr {
    Ptr::from_const(b.as_ptr())
}

fn pm(b: &mut [u8]) -> Ptr {
    Ptr::from_mut(b.as_mut_ptr())
}

struct Group {
    /// World ranks of the members, in group rank order.
    members: Vec<u32>,
    comm: Option<Communicator>,
}

/// Runs `op` blocking or on `stream` (then waits on the stream or on an event).
fn exec(comm: &Communicator, op: Op, stream: Option<&Stream>, via_event: bool) -> Result<(), String> {
    // SAFETY: every buffer of `op` is a live local Vec of the size the op uses, and outlives the
    // wait below.
    unsafe { comm.submit(op, stream) }.map_err(|e| e.to_string())?;
    if let Some(s) = stream {
        if via_event {
            let ev = Event::new();
            ev.record(Some(s));
            ev.synchronize().map_err(|e| e.to_string())?;
        } else {
            s.synchronize().map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

fn run() -> Result<String, String> {
    let mut args = std::env::args().skip(1);
    let ops: u64 = args.next().and_then(|a| a.parse().ok()).ok_or("usage: hccn-soak OPS [SEED]")?;
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0x5eed);
    let world = hccn_tools::join_job()?.control().clone();
    let (me, n) = (world.rank(), world.size());
    if n != 4 {
        return Err(format!("hccn-soak runs on 4 ranks, not {n}"));
    }
    let mut groups = vec![Group { members: (0..n).collect(), comm: None }];
    for members in [vec![0u32, 1, 2], vec![3u32, 1]] {
        let comm =
            if members.contains(&me) { Some(world.new_group(&members).map_err(|e| e.to_string())?) } else { None };
        groups.push(Group { members, comm });
    }
    let stream = Stream::new().map_err(|e| e.to_string())?;
    let mut shared = Rng(seed | 1);
    let mut own = Rng((seed ^ (u64::from(me) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
    let (mut checks, mut wrong, mut bytes_moved) = (0u64, 0u64, 0u64);
    let warm_at = (ops / 10).max(1);
    let mut warm = sample();
    let mut peak = warm;
    let started = Instant::now();
    let mut deciles = Vec::new();
    for i in 0..ops {
        // Samples at fixed operation numbers, whether or not this rank takes part in the op.
        if i == warm_at {
            warm = sample();
            peak = warm;
        }
        if i > warm_at && i % 100 == 0 {
            let now = sample();
            peak = (peak.0.max(now.0), peak.1.max(now.1));
        }
        if i > 0 && i % (ops / 10).max(1) == 0 {
            deciles.push(sample().0);
        }
        // Shared choices, made by every rank in the same order.
        let g = shared.below(3) as usize;
        let kind = shared.below(9);
        let dt = DataType::ALL[shared.below(DataType::ALL.len() as u64) as usize];
        let op = ReduceOp::ALL[shared.below(ReduceOp::ALL.len() as u64) as usize];
        let gn = groups[g].members.len() as u32;
        let root = shared.below(u64::from(gn)) as u32;
        let on_stream = shared.below(2) == 1;
        let via_event = shared.below(2) == 1;
        // Log-uniform sizes: most small, some near the limit. Vector ops divide by the group size.
        let vector = matches!(kind, 3..=7);
        let max_count = MAX_BYTES / dt.size() / if vector { gn as usize } else { 1 };
        let bits = shared.below(23);
        let count = (shared.below(1 << bits) as usize).min(max_count);
        // This rank's own small delay.
        let delay = own.below(2000);
        std::thread::sleep(Duration::from_micros(delay));
        let Some(comm) = groups[g].comm.as_ref().or(if g == 0 { Some(&world) } else { None }) else { continue };
        let r = comm.rank();
        let ranks: Vec<u32> = (0..gn).collect();
        let cnt = count as u64;
        let es = dt.size();
        let s = on_stream.then_some(&stream);
        let what = || {
            format!(
                "op {i}: kind {kind} {} {} count {count} root {root} group {g} stream {on_stream}",
                dt.name(),
                op.name()
            )
        };
        // (result buffer, expected bytes)
        let (got, want): (Vec<u8>, Option<Vec<u8>>) = match kind {
            0 => {
                let send = fill(dt, op, r, 0, count);
                let mut recv = vec![SENTINEL; count * es];
                exec(comm, Op::AllReduce { send: p(&send), recv: pm(&mut recv), count: cnt, dt, op }, s, via_event)
                    .map_err(|e| format!("{}: {e}", what()))?;
                (recv, Some(reduced(dt, op, &ranks, 0, count)))
            }
            1 => {
                let mut buf = fill(dt, op, r, 0, count);
                let bp = pm(&mut buf);
                exec(comm, Op::AllReduce { send: bp, recv: bp, count: cnt, dt, op }, s, via_event)
                    .map_err(|e| format!("{}: {e}", what()))?;
                (buf, Some(reduced(dt, op, &ranks, 0, count)))
            }
            2 => {
                let mut buf =
                    if r == root { fill(dt, ReduceOp::Sum, root, 0, count) } else { vec![SENTINEL; count * es] };
                exec(comm, Op::Broadcast { buf: pm(&mut buf), count: cnt, dt, root }, s, via_event)
                    .map_err(|e| format!("{}: {e}", what()))?;
                (buf, Some(fill(dt, ReduceOp::Sum, root, 0, count)))
            }
            3 => {
                let send = fill(dt, ReduceOp::Sum, r, 0, count);
                let mut recv = vec![SENTINEL; count * es * gn as usize];
                exec(comm, Op::AllGather { send: p(&send), recv: pm(&mut recv), send_count: cnt, dt }, s, via_event)
                    .map_err(|e| format!("{}: {e}", what()))?;
                (recv, Some(ranks.iter().flat_map(|&q| fill(dt, ReduceOp::Sum, q, 0, count)).collect()))
            }
            4 => {
                let send = fill(dt, op, r, 0, count * gn as usize);
                let mut recv = vec![SENTINEL; count * es];
                exec(
                    comm,
                    Op::ReduceScatter { send: p(&send), recv: pm(&mut recv), recv_count: cnt, dt, op },
                    s,
                    via_event,
                )
                .map_err(|e| format!("{}: {e}", what()))?;
                (recv, Some(reduced(dt, op, &ranks, r as usize * count, count)))
            }
            5 => {
                let send = fill(dt, ReduceOp::Sum, r, 0, count);
                let mut recv = vec![SENTINEL; count * es * gn as usize];
                exec(comm, Op::Gather { send: p(&send), recv: pm(&mut recv), send_count: cnt, dt, root }, s, via_event)
                    .map_err(|e| format!("{}: {e}", what()))?;
                let want =
                    (r == root).then(|| ranks.iter().flat_map(|&q| fill(dt, ReduceOp::Sum, q, 0, count)).collect());
                (recv, want)
            }
            6 => {
                let send = if r == root {
                    fill(dt, ReduceOp::Sum, root, 0, count * gn as usize)
                } else {
                    vec![SENTINEL; count * es * gn as usize]
                };
                let mut recv = vec![SENTINEL; count * es];
                exec(
                    comm,
                    Op::Scatter { send: p(&send), recv: pm(&mut recv), recv_count: cnt, dt, root },
                    s,
                    via_event,
                )
                .map_err(|e| format!("{}: {e}", what()))?;
                (recv, Some(fill(dt, ReduceOp::Sum, root, r as usize * count, count)))
            }
            7 => {
                let send = fill(dt, ReduceOp::Sum, r, 0, count * gn as usize);
                let mut recv = vec![SENTINEL; count * es * gn as usize];
                exec(comm, Op::AllToAll { send: p(&send), recv: pm(&mut recv), count_per_rank: cnt, dt }, s, via_event)
                    .map_err(|e| format!("{}: {e}", what()))?;
                (
                    recv,
                    Some(ranks.iter().flat_map(|&q| fill(dt, ReduceOp::Sum, q, r as usize * count, count)).collect()),
                )
            }
            _ => {
                let mut recv = vec![SENTINEL; count * es];
                let send = fill(dt, op, r, 0, count);
                exec(comm, Op::Reduce { send: p(&send), recv: pm(&mut recv), count: cnt, dt, op, root }, s, via_event)
                    .map_err(|e| format!("{}: {e}", what()))?;
                (recv, (r == root).then(|| reduced(dt, op, &ranks, 0, count)))
            }
        };
        bytes_moved += got.len() as u64;
        if let Some(want) = want {
            checks += 1;
            if let Some(at) = fixture::first_diff(dt, &got, &want) {
                wrong += 1;
                println!("FAIL {}: first wrong element {at}", what());
            }
        }
    }
    let end = sample();
    peak = (peak.0.max(end.0), peak.1.max(end.1));
    deciles.push(end.0);
    Ok(format!(
        "SOAK ops={ops} checks={checks} wrong={wrong} mib={} secs={:.1} warm_rss_kb={} peak_rss_kb={} end_rss_kb={} warm_fds={} peak_fds={} end_fds={} rss_kb_by_tenth={}",
        bytes_moved >> 20,
        started.elapsed().as_secs_f64(),
        warm.0,
        peak.0,
        end.0,
        warm.1,
        peak.1,
        end.1,
        deciles.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            let failed = !line.contains(" wrong=0 ");
            println!("{line}");
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            println!("ERROR {e}");
            ExitCode::FAILURE
        }
    }
}
