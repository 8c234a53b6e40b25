//! hccnrun: hosts the job's rendezvous store, starts N local ranks, forwards their output with a
//! rank prefix, and stops the whole job as soon as one rank fails, the time limit passes or
//! hccnrun itself is interrupted.

use std::ffi::OsString;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use hccn_runtime::{Config, StoreServer};

use crate::args::{self, Args, UsageError};
use crate::hostfile::{self, Host};
use crate::world::{EarlyExits, World};

mod job;
use job::{Job, Phase};

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
