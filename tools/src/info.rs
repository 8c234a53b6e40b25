//! `hccnrun -n N hccn-info` (or under srun, mpirun, torchrun ...): what the job runs on, printed
//! by rank 0 — the launcher found and where the ranks met, hosts and their ranks, the transport,
//! latency and bandwidth of every link (measured now by ping-pong), and the algorithm the runtime
//! picks per operation and size. Like `nvidia-smi topo -m` or `npu-smi info -t hccs`. Run by hand,
//! outside any launcher, it is a world of one.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::Instant;

use hccn_runtime::collectives::select;
use hccn_runtime::{backend, new_unique_id, BackendComm, Communicator, Config, LaunchEnv};
use hccn_runtime::{DataType, Op, Ptr, ReadCost, ReduceOp};

type Res<T> = hccn_runtime::Result<T>;

const USAGE: &str = "usage: hccnrun -n N hccn-info [--resources | --launcher]
       (or srun, mpirun, torchrun --no-python, msrun ...; alone: a world of one)
  Rank 0 prints the launcher found and where the ranks met, the hosts and their ranks, each
  link's transport, latency (half the median round trip of 20 8-byte ping-pongs) and bandwidth
  (4 MiB ping-pong), the algorithm chosen per operation and size, and every rank's resources:
  connections open, threads, shared memory mapped, peak resident memory, heartbeat messages per
  second.
  --resources: only the resources (no link is measured: quick at any size).
  --launcher: only what each process found: launcher, rank, size, local rank, node, where the
              store is and why (joins nothing).
  --version: hccn-info's version.
";

/// What `hccn-info` says where no launcher's variable is set.
const ALONE: &str = "launcher: none found (run by hand): a world of one; under srun, mpirun, torchrun, msrun \
                     or hccnrun the job's ranks meet (docs/launchers.md)";

/// Bytes of a host name in the allgather (longer names are cut).
const HOST_BYTES: usize = 64;
const PINGS: usize = 20;
const BW_BYTES: usize = 4 << 20;
const BW_REPS: usize = 3;
/// Sizes of the algorithm table.
const SIZES: [usize; 6] = [8, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length, which is what we pass.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if rc == 0 {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown".to_owned()
    }
}

/// Every rank's host name, by rank.
fn all_hostnames(comm: &Communicator) -> Res<Vec<String>> {
    let mut mine = [0u8; HOST_BYTES];
    let name = hostname();
    let len = name.len().min(HOST_BYTES);
    mine[..len].copy_from_slice(&name.as_bytes()[..len]);
    let mut all = vec![0u8; HOST_BYTES * comm.size() as usize];
    let op = Op::AllGather {
        send: Ptr::from_const(mine.as_ptr()),
        recv: Ptr::from_mut(all.as_mut_ptr()),
        send_count: HOST_BYTES as u64,
        dt: DataType::Uint8,
    };
    // SAFETY: `mine` and `all` are sized for this allgather and live through the blocking call.
    unsafe { comm.submit(op, None)? };
    Ok(all
        .chunks(HOST_BYTES)
        .map(|c| String::from_utf8_lossy(&c[..c.iter().position(|&b| b == 0).unwrap_or(c.len())]).into_owned())
        .collect())
}

fn send(comm: &Communicator, buf: &[u8], peer: u32) -> Res<()> {
    let op = Op::Send { buf: Ptr::from_const(buf.as_ptr()), count: buf.len() as u64, dt: DataType::Uint8, peer };
    // SAFETY: `buf` lives through the blocking call.
    unsafe { comm.submit(op, None) }
}

fn recv(comm: &Communicator, buf: &mut [u8], peer: u32) -> Res<()> {
    let op = Op::Recv { buf: Ptr::from_mut(buf.as_mut_ptr()), count: buf.len() as u64, dt: DataType::Uint8, peer };
    // SAFETY: `buf` lives through the blocking call.
    unsafe { comm.submit(op, None) }
}

/// Round trips of `buf` between this rank and `peer`; the leader times them, the other echoes.
fn ping_pong(comm: &Communicator, buf: &mut [u8], peer: u32, leader: bool, reps: usize) -> Res<Vec<f64>> {
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        if leader {
            send(comm, buf, peer)?;
            recv(comm, buf, peer)?;
        } else {
            recv(comm, buf, peer)?;
            send(comm, buf, peer)?;
        }
        times.push(t.elapsed().as_secs_f64());
    }
    Ok(times)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Transports as `measure_links` numbers them.
const TRANSPORTS: [&str; 2] = ["tcp", "shm"];

/// (latency µs, bandwidth GB/s, transport) of every pair `i < j`, in pair order, known on every rank: the
/// lower rank of each pair measures; a sum over ranks collects the numbers.
fn measure_links(comm: &Communicator) -> Res<Vec<f64>> {
    let (me, n) = (comm.rank(), comm.size());
    let pairs: Vec<(u32, u32)> = (0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j))).collect();
    let mut local = vec![0f64; pairs.len() * 3];
    let mut small = [0u8; 8];
    let mut big = vec![0u8; BW_BYTES];
    for (k, &(i, j)) in pairs.iter().enumerate() {
        // One link at a time, so that measurements do not share the machine.
        barrier(comm)?;
        if me != i && me != j {
            continue;
        }
        let (peer, leader) = if me == i { (j, true) } else { (i, false) };
        ping_pong(comm, &mut small, peer, leader, 2)?;
        let lat = median(ping_pong(comm, &mut small, peer, leader, PINGS)?) / 2.0;
        let bw = median(ping_pong(comm, &mut big, peer, leader, BW_REPS)?) / 2.0;
        if leader {
            local[3 * k] = lat * 1e6;
            local[3 * k + 1] = BW_BYTES as f64 / bw / 1e9;
            local[3 * k + 2] = TRANSPORTS.iter().position(|t| *t == comm.transport_to(peer)).unwrap_or(0) as f64;
        }
    }
    let mut all = vec![0f64; local.len()];
    comm.all_reduce(&local, &mut all, ReduceOp::Sum)?;
    Ok(all)
}

fn barrier(comm: &Communicator) -> Res<()> {
    // SAFETY: a barrier touches no caller memory.
    unsafe { comm.submit(Op::Barrier, None) }
}

fn size_label(b: usize) -> String {
    match b {
        b if b >= 1 << 20 => format!("{}M", b >> 20),
        b if b >= 1 << 10 => format!("{}K", b >> 10),
        b => format!("{b}B"),
    }
}

/// The algorithm a collective (an `Op::name`) over a buffer of so many bytes would run with.
pub type Planner<'a> = &'a dyn Fn(&str, usize) -> Option<&'static str>;

/// What the single-copy line says where a read costs more than the two copies it saves.
const NOT_WORTH_IT: &str = "not worth the two copies it saves, large heap chunks go through the rings \
                            (hccn_mem_alloc buffers are still read in place)";

/// The line on single-copy reads of shared-memory links: what one cost rank 0, if it measured.
fn reads_line(reads: Option<ReadCost>) -> String {
    match reads {
        Some(c) if c.read_us.is_finite() => format!(
            "# single-copy reads (process_vm_readv, 256 KiB) on rank 0's host: {:.1} us against a {:.1} us copy: {}",
            c.read_us,
            c.copy_us,
            if c.pays { "used for large chunks" } else { NOT_WORTH_IT }
        ),
        Some(_) => "# single-copy reads: this process could not read its own memory; the rings only".to_owned(),
        None => "# single-copy reads: not measured (no shared-memory peer, the kernel forbids them, or HCCN_CMA is on or off)"
            .to_owned(),
    }
}

/// The report rank 0 prints; `plan` says what this communicator would run; `reads`, what a
/// single-copy read cost rank 0.
pub fn report(hosts: &[String], links: &[f64], plan: Planner<'_>, reads: Option<ReadCost>) -> Vec<String> {
    let n = hosts.len() as u32;
    let mut by_host: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (r, h) in hosts.iter().enumerate() {
        by_host.entry(h).or_default().push(r.to_string());
    }
    let mut out = vec![format!("# hccn-info: {n} ranks on {} host(s)", by_host.len())];
    out.push(format!("{:<24} {:>6}  ranks", "host", "count"));
    for (h, ranks) in &by_host {
        out.push(format!("{h:<24} {:>6}  {}", ranks.len(), ranks.join(",")));
    }
    out.push(format!("# links: latency = half the median 8-byte round trip of {PINGS}; bandwidth over 4 MiB"));
    out.push(format!("{:<12} {:<10} {:>12} {:>12}", "link", "transport", "latency_us", "GB/s"));
    let pairs = (0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j)));
    for (k, (i, j)) in pairs.enumerate() {
        let (lat, bw) = (links[3 * k], links[3 * k + 1]);
        let transport = TRANSPORTS.get(links[3 * k + 2] as usize).copied().unwrap_or("tcp");
        out.push(format!("{:<12} {:<10} {lat:>12.1} {bw:>12.3}", format!("{i} <-> {j}"), transport));
    }
    out.push(reads_line(reads));
    out.push(format!(
        "# algorithm per operation and buffer size on these {n} ranks (small calls of ranks on one host: one round on shared memory; the others: the cost model, docs/algorithms.md)"
    ));
    let mut head = format!("{:<22}", "op");
    SIZES.iter().for_each(|&s| head.push_str(&format!(" {:>16}", size_label(s))));
    out.push(head);
    for op in select::OPS {
        let mut row = format!("{op:<22}");
        for &s in &SIZES {
            row.push_str(&format!(" {:>16}", plan(op, s).unwrap_or("-")));
        }
        out.push(row);
    }
    out
}

/// Joins the job its launcher describes, or makes a world of one where there is none; with
/// what was found, for the report.
fn join() -> Result<(Box<dyn BackendComm>, Vec<String>), String> {
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    hccn_runtime::log::init(&cfg);
    hccn_recovery::install();
    hccn_backend_hccl::install();
    match LaunchEnv::detect_env().map_err(|e| e.to_string())? {
        Some(env) => {
            let comm = backend::init_from_env(&env, &cfg)
                .map_err(|e| format!("rank {}: cannot join the job: {e}", env.rank))?;
            Ok((comm, env.describe()))
        }
        None => {
            let alone = new_unique_id(&cfg).and_then(|id| backend::init_rank(&id, 1, 0, &cfg));
            Ok((alone.map_err(|e| format!("cannot make a world of one: {e}"))?, vec![ALONE.to_owned()]))
        }
    }
}

/// `--launcher`: this process's detection, one line per fact, prefixed with its rank.
fn print_launcher() -> i32 {
    let mut out = io::stdout().lock();
    match LaunchEnv::detect_env() {
        Ok(Some(env)) => {
            for line in env.describe() {
                let _ = writeln!(out, "[{}] {line}", env.rank);
            }
            0
        }
        Ok(None) => {
            let _ = writeln!(out, "{ALONE}");
            0
        }
        Err(e) => {
            let _ = writeln!(io::stderr(), "hccn-info: {e}");
            1
        }
    }
}

fn run(resources_only: bool) -> Result<(), String> {
    let (joined, launcher) = join()?;
    // Hosts and links are the control plane's, on any backend.
    let comm = joined.control();
    let me = comm.rank();
    let failed = |what: &'static str| move |e: hccn_runtime::Error| format!("rank {me}: {what} failed: {e}");
    let mut lines = Vec::new();
    if !resources_only {
        let hosts = all_hostnames(comm).map_err(failed("host name exchange"))?;
        let links = measure_links(comm).map_err(failed("link measurement"))?;
        let plan = |op: &str, bytes: usize| comm.plan(op, bytes).ok().flatten().map(|(algo, _)| algo);
        lines = report(&hosts, &links, &plan, hccn_runtime::read_cost());
    }
    // What started the job and where its ranks met, after the topology.
    lines.extend(launcher.iter().map(|l| format!("# {l}")));
    let usage = crate::resources::measure(comm).map_err(failed("resource count"))?;
    lines.extend(crate::resources::report(&usage));
    if me == 0 {
        let mut out = io::stdout().lock();
        for line in lines {
            writeln!(out, "{line}").map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// hccn-info's entry point; returns the process exit code.
pub fn main() -> i32 {
    if std::env::args().skip(1).any(|a| a == "--version") {
        return crate::print_version("hccn-info");
    }
    if std::env::args().skip(1).any(|a| a == "-h" || a == "--help") {
        let _ = io::stdout().write_all(USAGE.as_bytes());
        return 0;
    }
    let mut resources_only = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--resources" => resources_only = true,
            "--launcher" => return print_launcher(),
            _ => {
                let _ = writeln!(io::stderr(), "hccn-info: unexpected argument {arg:?}\n{USAGE}");
                return 2;
            }
        }
    }
    match run(resources_only) {
        Ok(()) => 0,
        Err(msg) => {
            let _ = writeln!(io::stderr(), "hccn-info: {msg}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_groups_ranks_by_host_and_lists_every_pair() {
        let hosts: Vec<String> = ["a", "b", "a"].iter().map(|s| s.to_string()).collect();
        let plan = |op: &str, bytes: usize| hccn_runtime::collectives::select::algorithm_name(op, bytes, 3);
        let reads = Some(ReadCost { read_us: 31.0, copy_us: 7.5, pays: false });
        let r = report(&hosts, &[1.0, 2.0, 1.0, 3.0, 4.0, 0.0, 5.0, 6.0, 0.0], &plan, reads);
        assert!(r.iter().any(|l| l.contains("31.0 us against a 7.5 us copy: not worth")), "{r:#?}");
        assert!(r.iter().any(|l| l.starts_with("a ") && l.ends_with("2  0,2")), "{r:#?}");
        assert!(r.iter().any(|l| l.starts_with("1 <-> 2") && l.contains("tcp")), "{r:#?}");
        assert!(r.iter().any(|l| l.starts_with("0 <-> 1") && l.contains("shm")), "{r:#?}");
        assert!(r.iter().any(|l| l.starts_with("allreduce ") && l.contains("ring")), "{r:#?}");
    }
}
