//! hccnrun: hosts the job's rendezvous store, starts N local ranks, forwards their output with a
//! rank prefix, and stops the whole job as soon as one rank fails, the time limit passes or
//! hccnrun itself is interrupted.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hccn_runtime::{Config, StoreServer};

use crate::args::{self, Args, UsageError};
use crate::hostfile::{self, Host};
use crate::world::{EarlyExits, World};

/// How `--hostfile` starts remote ranks unless `--remote-cmd` says otherwise.
const DEFAULT_REMOTE: &str = "ssh -o BatchMode=yes";

pub const USAGE: &str = "\
usage: hccnrun -n N [--nnodes M --node-rank I | --hostfile FILE [--remote-cmd CMD]]
               [--bind-to core|none] [--timeout SECONDS] [--grace SECONDS]
               [--store URL | --etcd-local] [--elastic [--min-ranks M] [--max-restarts K]]
               [--] PROGRAM [ARGS...]

Starts N ranks of PROGRAM on this host around an embedded rendezvous store. Each rank gets
HCCN_RANK, HCCN_WORLD_SIZE, HCCN_LOCAL_RANK, HCCN_LOCAL_WORLD_SIZE, HCCN_STORE, HCCN_JOB_ID and
HCCN_JOB_TOKEN; its stdout and stderr lines are prefixed with \"[rank] \". Stdin is not forwarded.

  -n, -np, --np N      number of ranks (required; -np as mpirun spells it)
  --bind-to core|none  core: bind each rank started here to one of the CPUs hccnrun may use,
                       local rank i to the i-th modulo their number (as mpirun --bind-to core);
                       none (the default): the scheduler places them
  --timeout SECONDS    stop the job and exit 124 when it runs longer
  --grace SECONDS      after a rank fails, how long the others may finish on their own before
                       they get SIGTERM (default 3); SIGKILL follows 1 s after SIGTERM
  --nnodes M           the job spans M hosts, each running its own hccnrun with -n ranks; the
                       world has M*N ranks. Needs --store, and the same HCCN_JOB_ID and
                       HCCN_JOB_TOKEN in every hccnrun's environment
  --node-rank I        this host's index (0..M-1): its ranks are I*N .. I*N+N-1
  --hostfile FILE      start the job from here across the hosts in FILE, one per line:
                       `NAME [slots=N] [addr=IP]` (ranks fill hosts in order; -n defaults to
                       all slots; `localhost` runs here). Remote ranks listen on addr= (else
                       NAME resolved); the embedded store listens on HCCN_BIND_ADDR, which must
                       then be an address the hosts reach
  --remote-cmd CMD     how remote ranks start (default `ssh -o BatchMode=yes`): `{host}` in CMD
                       is the host's name, else it is appended; e.g. `ip netns exec {host}`
  --store URL          use this rendezvous store (etcd://host:port[,host:port...] or
                       tcp://host:port) instead of hosting an embedded one
  --etcd-local         start a private etcd for the job (loopback, temporary data directory)
                       and stop it afterwards
  --elastic            a rank that fails does not stop the job: the others go on (they shrink
                       or rebuild their communicators) and a replacement is started, which joins
                       at the next epoch when the survivors call hccn_comm_rebuild
  --min-ranks M        with --elastic: give up when fewer than M ranks are left (default 1)
  --max-restarts K     with --elastic: replacements to start in all (default 3); a failure
                       after the last one ends the job
  -h, --help           this text

A rank that exits before the world has formed (the ranks that joined would wait for it until
HCCN_TIMEOUT_MS) stops the job at once, naming it. After a clean end with an etcd store, the
job's keys are removed from it.

Exit status: 0 when every rank exits 0; otherwise the first failing rank's code (128+N for
signal N; 1 for a rank that exited 0 before the world formed), 124 on timeout, 128+N when
hccnrun receives signal N (SIGINT, SIGTERM, SIGHUP are forwarded to the ranks; a second one
kills them at once), 2 on bad usage.
";

/// How long stopped ranks get between SIGTERM and SIGKILL.
const TERM_TO_KILL: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(15);
/// How long output may keep flowing after every rank has exited; only a descendant that left
/// its rank's process group can hold a pipe open that long.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);
const EXIT_TIMEOUT: i32 = 124;

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub nranks: u32,
    pub timeout: Option<Duration>,
    pub grace: Duration,
    /// `Some` with --elastic.
    pub elastic: Option<Elastic>,
    /// An external store (`--store`); `None` hosts an embedded one.
    pub store: Option<String>,
    /// `--etcd-local`: start a private etcd for the job.
    pub etcd_local: bool,
    /// `--nnodes`, `--node-rank`: hosts in the job and this one's index.
    pub nnodes: u32,
    pub node_rank: u32,
    /// `--hostfile`: the hosts this hccnrun starts ranks on, and how.
    pub hosts: Option<Vec<Host>>,
    pub remote_cmd: String,
    /// `--bind-to core`: each rank started on this host runs on one CPU only.
    pub bind_to_core: bool,
    pub program: OsString,
    pub args: Vec<OsString>,
}

impl Options {
    /// Where rank `rank` runs (this host unless the host file puts it elsewhere).
    fn place(&self, rank: u32) -> Result<hostfile::Place<'_>, String> {
        match &self.hosts {
            Some(hosts) => hostfile::place(hosts, self.nranks, rank),
            None => {
                Ok(hostfile::Place { host: None, local: rank - self.node_rank * self.nranks, local_size: self.nranks })
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elastic {
    pub min_ranks: u32,
    pub max_restarts: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Invocation {
    Run(Options),
    Help,
}

pub fn parse(mut a: Args) -> Result<Invocation, UsageError> {
    let mut nranks = None;
    let mut timeout = None;
    let mut grace = Duration::from_secs(3);
    let (mut elastic, mut min_ranks, mut max_restarts, mut store, mut etcd_local) = (false, None, None, None, false);
    let (mut nnodes, mut node_rank) = (1u32, None);
    let (mut hosts, mut remote_cmd) = (None, DEFAULT_REMOTE.to_owned());
    let mut bind_to_core = false;
    while let Some((name, inline)) = a.next_option()? {
        match name.as_str() {
            "-h" | "--help" => return Ok(Invocation::Help),
            // `-np` is mpirun's spelling, the one MPI users type first.
            "-n" | "-np" | "--np" => {
                let n: u32 = args::number(&name, &a.value(&name, inline)?)?;
                if n == 0 {
                    return Err(UsageError(format!("{name} must be at least 1")));
                }
                nranks = Some(n);
            }
            "--timeout" => {
                let t = args::seconds(&name, &a.value(&name, inline)?)?;
                if t.is_zero() {
                    return Err(UsageError("--timeout must be more than 0".into()));
                }
                timeout = Some(t);
            }
            "--grace" => grace = args::seconds(&name, &a.value(&name, inline)?)?,
            "--elastic" => elastic = true,
            "--etcd-local" => etcd_local = true,
            "--nnodes" => nnodes = args::number(&name, &a.value(&name, inline)?)?,
            "--node-rank" => node_rank = Some(args::number::<u32>(&name, &a.value(&name, inline)?)?),
            "--store" => {
                let url = a.value(&name, inline)?;
                hccn_runtime::StoreAddr::parse(&url).map_err(|e| UsageError(e.to_string()))?;
                store = Some(url);
            }
            "--hostfile" => {
                let path = a.value(&name, inline)?;
                let text = std::fs::read_to_string(&path).map_err(|e| UsageError(format!("--hostfile {path}: {e}")))?;
                hosts = Some(hostfile::parse(&text).map_err(|e| UsageError(format!("--hostfile {path}: {e}")))?);
            }
            "--remote-cmd" => remote_cmd = a.value(&name, inline)?,
            "--bind-to" => {
                bind_to_core = match a.value(&name, inline)?.as_str() {
                    "core" => true,
                    "none" => false,
                    v => return Err(UsageError(format!("--bind-to {v}: expected core or none"))),
                }
            }
            "--min-ranks" => min_ranks = Some(args::number::<u32>(&name, &a.value(&name, inline)?)?),
            "--max-restarts" => max_restarts = Some(args::number::<u32>(&name, &a.value(&name, inline)?)?),
            _ => return Err(UsageError(format!("unknown option {name}"))),
        }
    }
    let slots = hosts.as_ref().map(|h: &Vec<Host>| h.iter().map(|h| h.slots).sum::<u32>());
    let nranks = nranks.or(slots).ok_or_else(|| UsageError("the number of ranks (-n N) is required".into()))?;
    if let Some(hosts) = &hosts {
        if nnodes > 1 {
            return Err(UsageError("--hostfile and --nnodes exclude each other".into()));
        }
        hostfile::place(hosts, nranks, 0).map_err(UsageError)?;
    }
    let node_rank = node_rank.unwrap_or(0);
    if nnodes == 0 || node_rank >= nnodes {
        return Err(UsageError(format!("--node-rank {node_rank} must be below --nnodes {nnodes}")));
    }
    if nnodes > 1 && store.is_none() {
        return Err(UsageError("--nnodes needs --store: every host's ranks must meet in one store".into()));
    }
    if etcd_local && store.is_some() {
        return Err(UsageError("--store and --etcd-local exclude each other".into()));
    }
    if !elastic && (min_ranks.is_some() || max_restarts.is_some()) {
        return Err(UsageError("--min-ranks and --max-restarts go with --elastic".into()));
    }
    let elastic =
        elastic.then_some(Elastic { min_ranks: min_ranks.unwrap_or(1), max_restarts: max_restarts.unwrap_or(3) });
    let mut rest = a.rest().into_iter();
    let program = rest.next().ok_or_else(|| UsageError("no PROGRAM given".into()))?;
    Ok(Invocation::Run(Options {
        nranks,
        timeout,
        grace,
        elastic,
        store,
        etcd_local,
        nnodes,
        node_rank,
        hosts,
        remote_cmd,
        bind_to_core,
        program,
        args: rest.collect(),
    }))
}

/// hccnrun's entry point; returns the process exit code.
pub fn main() -> i32 {
    match parse(Args::from_env()) {
        Ok(Invocation::Help) => {
            let _ = io::stdout().write_all(USAGE.as_bytes());
            0
        }
        Err(e) => {
            let first = USAGE.lines().next().unwrap_or_default();
            let _ = writeln!(io::stderr(), "hccnrun: {e}\n{first}\n(hccnrun --help for more)");
            2
        }
        Ok(Invocation::Run(o)) => match run(&o) {
            Ok(code) => code,
            Err(msg) => {
                say(format_args!("{msg}"));
                1
            }
        },
    }
}

/// hccnrun's own messages. Written under the stderr lock so they never split a rank's line.
pub(crate) fn say(msg: std::fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "hccnrun: {msg}");
}

fn random_hex<const N: usize>() -> Result<String, String> {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).map_err(|e| format!("no randomness for the job token: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The last of SIGINT, SIGTERM or SIGHUP received and not yet handled (0 if none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

fn install_signal_handlers() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to a lock-free atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, handler as libc::sighandler_t) };
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGSYS => "SIGSYS",
        _ => "unknown signal",
    }
}

/// hccnrun's exit code for a rank that ended with `status`, as a shell reports it.
fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => {
            let core = if status.core_dumped() { " (core dumped)" } else { "" };
            format!("was killed by signal {s} ({}){core}", signal_name(s))
        }
        (None, None) => format!("ended with status {status}"),
    }
}

/// Copies `pipe` to hccnrun's stdout or stderr line by line, each line prefixed with the rank.
fn forward(rank: u32, pipe: impl Read, to_stderr: bool) {
    let prefix = format!("[{rank}] ");
    let mut reader = BufReader::with_capacity(64 << 10, pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        // A closed terminal or pipe must not stop the draining, or the rank would block on a
        // full pipe; its output is then lost, as it would be without hccnrun.
        let _ = if to_stderr {
            io::stderr().lock().write_all(&line)
        } else {
            let mut out = io::stdout().lock();
            out.write_all(&line).and_then(|()| out.flush())
        };
    }
}

/// One started rank. Its pid is also its process group id.
struct Rank {
    rank: u32,
    pid: i32,
    child: Child,
    status: Option<ExitStatus>,
}

impl Rank {
    /// Signals the rank's process group (its descendants too), or the rank alone if it moved to
    /// another group. Never called once the rank is reaped, so the pid cannot be a reused one.
    fn signal(&self, sig: i32) {
        // SAFETY: plain syscalls on a pid that is still ours (running or an unreaped zombie).
        unsafe {
            if libc::kill(-self.pid, sig) != 0 {
                libc::kill(self.pid, sig);
            }
        }
    }

    /// Reaps the rank if it has exited. Before reaping, whatever the rank left running in its
    /// process group is killed: nothing may outlive the job, and the zombie keeps the group id
    /// from being reused until then.
    fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_some() {
            return self.status;
        }
        // SAFETY: zeroed siginfo_t is a valid value; waitid leaves si_pid 0 when nothing exited.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        // SAFETY: `info` is a valid out-pointer for the call.
        let rc = unsafe { libc::waitid(libc::P_PID, self.pid as libc::id_t, &mut info, flags) };
        if rc != 0 {
            // Not expected for a child of ours that is not reaped yet; std's own bookkeeping
            // then decides, without the group clean-up.
            self.status = self.child.try_wait().ok().flatten();
            return self.status;
        }
        // SAFETY: waitid succeeded, so `info` is filled in (or still zeroed).
        if unsafe { info.si_pid() } == 0 {
            return None;
        }
        // SAFETY: the group's leader is an unreaped zombie, so the id is still this job's.
        unsafe { libc::kill(-self.pid, libc::SIGKILL) };
        // The rank has exited, so this returns at once; an error here would mean someone else
        // reaped it, and it counts as a failure rather than leaving the job waiting for it.
        self.status = Some(self.child.wait().unwrap_or_else(|_| ExitStatus::from_raw(1 << 8)));
        self.status
    }
}

/// What the job is doing about stopping.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Running,
    /// A rank failed; the others may finish until the deadline.
    Grace(Instant),
    /// Remaining ranks have been told to stop; SIGKILL follows at the deadline.
    Stopping(Instant),
    Killed,
}

struct Job {
    ranks: Vec<Rank>,
    /// The job's store, asked whether the world formed when ranks exit.
    world: World,
    early: EarlyExits,
    readers: Vec<(u32, JoinHandle<()>)>,
    /// hccnrun's exit code, fixed by the first event that decides it.
    outcome: Option<i32>,
    phase: Phase,
    /// Replacements started so far (--elastic).
    restarts: u32,
}

/// The CPU that local rank `local` is bound to with `--bind-to core`: the `local`-th, modulo
/// their number, of the CPUs this process may run on.
fn core_for(local: u32) -> io::Result<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a writable cpu_set_t of the size given.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CPU_ISSET reads the set within its size (cpu < CPU_SETSIZE).
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect();
    if cpus.is_empty() {
        return Err(io::Error::other("--bind-to core: this process may run on no CPU"));
    }
    Ok(cpus[local as usize % cpus.len()])
}

impl Job {
    /// Starts rank `rank`: here, or on its host from the host file through the remote command.
    fn spawn(&mut self, o: &Options, rank: u32, env: &[(&str, String)]) -> io::Result<()> {
        let place = o.place(rank).map_err(io::Error::other)?;
        let mut vars: Vec<(String, String)> = env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        vars.push(("HCCN_RANK".into(), rank.to_string()));
        vars.push(("HCCN_LOCAL_RANK".into(), place.local.to_string()));
        vars.push(("HCCN_LOCAL_WORLD_SIZE".into(), place.local_size.to_string()));
        let mut cmd = match place.host {
            None => {
                let mut cmd = Command::new(&o.program);
                cmd.args(&o.args).envs(vars.iter().map(|(k, v)| (k, v)));
                cmd
            }
            Some(host) => {
                // The remote side gets no environment of ours (ssh forwards none), so the
                // settings given to hccnrun travel on the command line.
                let forwarded =
                    std::env::vars().filter(|(k, _)| k.starts_with("HCCN_") && !vars.iter().any(|(v, _)| v == k));
                let mut all: Vec<(String, String)> = forwarded.collect();
                all.extend(vars);
                let addr = hostfile::listen_addr(host).map_err(io::Error::other)?;
                all.retain(|(k, _)| k != "HCCN_BIND_ADDR");
                all.push(("HCCN_BIND_ADDR".into(), addr.to_string()));
                let argv =
                    hostfile::remote_argv(&o.remote_cmd, host, &all, &o.program, &o.args).map_err(io::Error::other)?;
                let mut cmd = Command::new(&argv[0]);
                cmd.args(&argv[1..]);
                cmd
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so that stopping a rank reaches whatever it started (a shell's
            // children, say) and a terminal's Ctrl-C reaches the ranks only through hccnrun.
            .process_group(0);
        let parent = std::process::id() as libc::pid_t;
        let cpu = match place.host {
            None if o.bind_to_core => Some(core_for(place.local)?),
            _ => None,
        };
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe calls (prctl, getppid, sched_setaffinity).
        unsafe {
            cmd.pre_exec(move || {
                if let Some(cpu) = cpu {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                // The rank dies with hccnrun even when hccnrun is SIGKILLed.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // hccnrun may have died before the prctl took effect.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            })
        };
        let mut child = cmd.spawn()?;
        let pid = child.id() as i32;
        let pipes = (child.stdout.take(), child.stderr.take());
        self.ranks.push(Rank { rank, pid, child, status: None });
        if let Some(out) = pipes.0 {
            self.readers.push((rank, start_reader(rank, out, false)?));
        }
        if let Some(err) = pipes.1 {
            self.readers.push((rank, start_reader(rank, err, true)?));
        }
        Ok(())
    }

    fn running(&self) -> impl Iterator<Item = &Rank> {
        self.ranks.iter().filter(|r| r.status.is_none())
    }

    fn signal_running(&self, sig: i32) {
        let ranks: Vec<String> = self.running().map(|r| r.rank.to_string()).collect();
        if ranks.is_empty() {
            return;
        }
        say(format_args!("sending {} to rank(s) {}", signal_name(sig), ranks.join(", ")));
        for r in self.running() {
            r.signal(sig);
        }
    }

    /// Tells the remaining ranks to stop with `sig`; SIGKILL follows after [`TERM_TO_KILL`].
    fn stop(&mut self, sig: i32) {
        self.signal_running(sig);
        self.phase = Phase::Stopping(Instant::now() + TERM_TO_KILL);
    }

    fn kill(&mut self) {
        self.signal_running(libc::SIGKILL);
        self.phase = Phase::Killed;
    }

    /// With --elastic, decides what a failed rank means: a replacement while restarts last and
    /// enough ranks remain (`true`), or the end of the job (`false`).
    fn recover(&mut self, o: &Options, env: &[(&str, String)], rank: u32) -> bool {
        let Some(el) = o.elastic else { return false };
        let alive = self.running().count() as u32;
        if alive < el.min_ranks {
            say(format_args!("only {alive} rank(s) left, fewer than --min-ranks {}; giving up", el.min_ranks));
            return false;
        }
        if self.restarts >= el.max_restarts {
            say(format_args!("no restarts left (--max-restarts {}); giving up", el.max_restarts));
            return false;
        }
        self.restarts += 1;
        say(format_args!("starting a replacement for rank {rank} (restart {} of {})", self.restarts, el.max_restarts));
        match self.spawn(o, rank, env) {
            Ok(()) => true,
            Err(e) => {
                say(format_args!("cannot start a replacement for rank {rank}: {e}"));
                false
            }
        }
    }

    /// Watches the ranks until every one has been reaped; returns hccnrun's exit code.
    fn monitor(&mut self, o: &Options, env: &[(&str, String)], started: Instant) -> i32 {
        loop {
            let (mut failed, mut exited) = (Vec::new(), Vec::new());
            for r in self.ranks.iter_mut().filter(|r| r.status.is_none()) {
                let Some(status) = r.poll() else { continue };
                // Once the job is being stopped, ranks ending by our signals are expected.
                let stopping = matches!(self.phase, Phase::Stopping(_) | Phase::Killed);
                if !status.success() && !stopping {
                    say(format_args!("rank {} (pid {}) {}", r.rank, r.pid, describe(status)));
                    failed.push((r.rank, status));
                }
                if !stopping {
                    exited.push((r.rank, format!("(pid {}) {}", r.pid, describe(status)), exit_code(status)));
                }
            }
            // A rank gone before the world formed is one the others wait for until their timeout.
            if matches!(self.phase, Phase::Running | Phase::Grace(_)) {
                let running: Vec<u32> = self.running().map(|r| r.rank).collect();
                if let Some((why, code)) = self.early.check(&mut self.world, exited, &running) {
                    say(format_args!("{why}"));
                    self.outcome.get_or_insert(code);
                    self.stop(libc::SIGTERM);
                }
            }
            for (rank, status) in failed {
                if self.phase == Phase::Running && self.recover(o, env, rank) {
                    continue;
                }
                self.outcome.get_or_insert(exit_code(status));
                if self.phase == Phase::Running {
                    self.phase = Phase::Grace(Instant::now() + o.grace);
                }
            }
            if self.running().next().is_none() {
                return self.outcome.unwrap_or(0);
            }
            let now = Instant::now();
            let sig = SIGNAL.swap(0, Ordering::SeqCst);
            if sig != 0 {
                if matches!(self.phase, Phase::Stopping(_) | Phase::Killed) {
                    say(format_args!("received {} again, killing ranks", signal_name(sig)));
                    self.kill();
                } else {
                    say(format_args!("received {}, stopping ranks", signal_name(sig)));
                    self.outcome.get_or_insert(128 + sig);
                    self.stop(sig);
                }
            }
            if let Some(limit) = o.timeout {
                let in_time = matches!(self.phase, Phase::Running | Phase::Grace(_));
                if in_time && now.duration_since(started) >= limit {
                    say(format_args!("timeout after {} s, stopping ranks", limit.as_secs_f64()));
                    self.outcome.get_or_insert(EXIT_TIMEOUT);
                    self.stop(libc::SIGTERM);
                }
            }
            match self.phase {
                Phase::Grace(deadline) if now >= deadline => self.stop(libc::SIGTERM),
                Phase::Stopping(deadline) if now >= deadline => self.kill(),
                _ => {}
            }
            std::thread::sleep(POLL);
        }
    }

    /// Joins the output threads so that every line reaches hccnrun's output before it exits.
    fn drain(&mut self) {
        let deadline = Instant::now() + DRAIN_LIMIT;
        while self.readers.iter().any(|(_, t)| !t.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (done, open): (Vec<_>, Vec<_>) = self.readers.drain(..).partition(|(_, t)| t.is_finished());
        for (_, t) in done {
            let _ = t.join();
        }
        if !open.is_empty() {
            let ranks: Vec<String> = open.iter().map(|(r, _)| r.to_string()).collect();
            say(format_args!(
                "output of rank(s) {} is still open after they exited (a process that left the rank's \
                 process group holds it); not waiting for it",
                ranks.join(", ")
            ));
        }
    }
}

fn start_reader(rank: u32, pipe: impl Read + Send + 'static, to_stderr: bool) -> io::Result<JoinHandle<()>> {
    let stream = if to_stderr { "err" } else { "out" };
    std::thread::Builder::new().name(format!("rank{rank}-{stream}")).spawn(move || forward(rank, pipe, to_stderr))
}

/// A store hccnrun runs for the job; dropping it stops it.
#[allow(dead_code)] // Held for its Drop.
enum Hosted {
    Embedded(StoreServer),
    Etcd(crate::etcd_local::LocalEtcd),
}

/// Runs the job and returns hccnrun's exit code; `Err` only when it could not be set up.
pub fn run(o: &Options) -> Result<i32, String> {
    let started = Instant::now();
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    // The embedded store logs what it refuses (HCCN_LOG, to hccnrun's stderr).
    hccn_runtime::log::init(&cfg);
    // Ranks read the token as a string and use its bytes, so the store gets the same bytes. A
    // job on several hosts shares one token (and job id) through the environment.
    let token = match cfg.job_token.clone() {
        Some(t) => t,
        None if o.nnodes > 1 => {
            return Err("--nnodes needs HCCN_JOB_TOKEN (and HCCN_JOB_ID) shared by every host".into())
        }
        None => random_hex::<32>()?,
    };
    if o.nnodes > 1 && cfg.job_id.is_none() {
        return Err("--nnodes needs HCCN_JOB_ID (and HCCN_JOB_TOKEN) shared by every host".into());
    }
    let job_id = match cfg.job_id.clone() {
        Some(id) => id,
        None => format!("job-{}", random_hex::<4>()?),
    };
    let remote = o.hosts.iter().flatten().any(|h| h.name != "localhost");
    if remote && o.etcd_local {
        return Err("--etcd-local listens on loopback only, out of the remote hosts' reach; give --store".into());
    }
    if remote && o.store.is_none() && cfg.bind_addr.is_loopback() {
        return Err(format!(
            "--hostfile with remote hosts: the embedded store would listen on {} (HCCN_BIND_ADDR), which they cannot reach; set HCCN_BIND_ADDR to this host's address or give --store",
            cfg.bind_addr
        ));
    }
    // A store started here lives as long as the job; an external one is only named.
    let (hosted, store_url) = match &o.store {
        Some(url) => (None, url.clone()),
        None if o.etcd_local => {
            let etcd = crate::etcd_local::LocalEtcd::start().map_err(|e| format!("--etcd-local: {e}"))?;
            let url = etcd.url();
            (Some(Hosted::Etcd(etcd)), url)
        }
        None => {
            let s = StoreServer::start(SocketAddr::new(cfg.bind_addr, 0), token.as_bytes())
                .map_err(|e| format!("cannot start the store: {e}"))?;
            let url = format!("tcp://{}", s.local_addr());
            (Some(Hosted::Embedded(s)), url)
        }
    };
    let world = World::new(&store_url, token.as_bytes(), &cfg, &job_id);
    let keeps_keys = store_url.starts_with("etcd://") && hosted.is_none();
    let env = [
        ("HCCN_WORLD_SIZE", (o.nnodes * o.nranks).to_string()),
        ("HCCN_STORE", store_url),
        ("HCCN_JOB_ID", job_id),
        ("HCCN_JOB_TOKEN", token),
    ];
    install_signal_handlers();
    let mut job = Job {
        ranks: Vec::new(),
        world,
        early: EarlyExits::default(),
        readers: Vec::new(),
        outcome: None,
        phase: Phase::Running,
        restarts: 0,
    };
    for rank in o.node_rank * o.nranks..(o.node_rank + 1) * o.nranks {
        if let Err(e) = job.spawn(o, rank, &env) {
            say(format_args!("cannot start rank {rank} ({}): {e}", o.program.to_string_lossy()));
            job.outcome = Some(if e.kind() == io::ErrorKind::NotFound { 127 } else { 126 });
            job.stop(libc::SIGTERM);
            break;
        }
    }
    let mut code = job.monitor(o, &env, started);
    job.drain();
    // A rank that its world left behind (a frozen rank that woke after the others went on, the
    // small side of a partition) says so in the store: the job did not end well, whatever
    // that rank's exit code.
    if let Some(Hosted::Embedded(store)) = &hosted {
        for (key, why) in store.find("/excluded/") {
            let rank = key.rsplit('/').next().unwrap_or("?");
            say(format_args!("rank {rank} was left out of its world: {}", String::from_utf8_lossy(&why)));
            if code == 0 {
                code = 1;
            }
        }
    }
    // A store that outlives the job keeps its keys until someone removes them: after a clean
    // end, this host's hccnrun does (one of them is enough).
    if code == 0 && o.node_rank == 0 && keeps_keys {
        job.world.clean_up();
    }
    drop(hosted);
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(a: &[&str]) -> Result<Invocation, UsageError> {
        parse(Args::new(a.iter().copied()))
    }

    #[test]
    fn parses_a_command_line() {
        let c = parse_strs(&["-n", "3", "--timeout", "1.5", "--grace=0", "--", "prog", "-n", "5"]);
        let Ok(Invocation::Run(o)) = c else { panic!("not parsed: {c:?}") };
        assert_eq!(o.nranks, 3);
        assert_eq!(o.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(o.grace, Duration::ZERO);
        assert_eq!(o.program, "prog");
        assert_eq!(o.args, vec![OsString::from("-n"), OsString::from("5")]);
        let Ok(Invocation::Run(o)) = parse_strs(&["-n", "1", "prog"]) else { panic!("not parsed") };
        let Ok(Invocation::Run(np)) = parse_strs(&["-np", "1", "prog"]) else { panic!("-np not parsed") };
        assert_eq!(np, o, "-np is -n");
        assert_eq!((o.timeout, o.grace, o.bind_to_core), (None, Duration::from_secs(3), false));
        let Ok(Invocation::Run(o)) = parse_strs(&["-n", "2", "--bind-to", "core", "prog"]) else { panic!("bind") };
        assert!(o.bind_to_core);
        assert!(parse_strs(&["-n", "2", "--bind-to=socket", "prog"]).is_err());
        assert_eq!(parse_strs(&["--help"]), Ok(Invocation::Help));
    }

    #[test]
    fn refuses_bad_usage() {
        for bad in
            [&["prog"][..], &["-n", "0", "prog"], &["-n", "2"], &["-n", "x", "p"], &["--timeout", "0", "-n", "1", "p"]]
        {
            assert!(parse_strs(bad).is_err(), "{bad:?}");
        }
        assert!(parse_strs(&["-n", "2", "--bogus", "p"]).is_err());
    }

    #[test]
    fn a_host_file_sets_the_world_and_excludes_nnodes() {
        let dir = std::env::temp_dir().join(format!("hccnrun-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("hosts");
        std::fs::write(&file, "a slots=2\nb slots=3\n").expect("write");
        let f = file.to_string_lossy().into_owned();
        let Ok(Invocation::Run(o)) = parse_strs(&["--hostfile", &f, "p"]) else { panic!("not parsed") };
        assert_eq!((o.nranks, o.remote_cmd.as_str()), (5, DEFAULT_REMOTE));
        assert!(parse_strs(&["--hostfile", &f, "-n", "6", "p"]).is_err(), "more ranks than slots");
        assert!(parse_strs(&["--hostfile", &f, "--nnodes", "2", "--store", "tcp://127.0.0.1:1", "p"]).is_err());
        assert!(parse_strs(&["--hostfile", "/nonexistent/hosts", "p"]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn statuses_read_like_a_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(describe(ExitStatus::from_raw(9)), "was killed by signal 9 (SIGKILL)");
        assert_eq!(describe(ExitStatus::from_raw(3 << 8)), "exited with code 3");
    }
}
