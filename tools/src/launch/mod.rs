//! hccnrun: hosts the job's rendezvous store, starts N local ranks (as torchrun and mpirun start
//! theirs), forwards their output labelled with each process's current rank, and stops the whole
//! job as soon as one rank fails, the time limit passes or hccnrun itself is interrupted.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use hccn_runtime::{Config, StoreServer};

use crate::args::Args;
use crate::world::World;

mod env;
mod exits;
mod guard;
mod job;
mod limits;
pub mod options;
mod output;
mod roster;
mod trampoline;

use job::Job;
pub use options::{parse, Elastic, Invocation, Options, USAGE};

/// hccnrun's entry point; returns the process exit code.
pub fn main() -> i32 {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == trampoline::FLAG) {
        trampoline::run(&args[1..]);
    }
    match parse(Args::from_env()) {
        Ok(Invocation::Help) => {
            let _ = io::stdout().write_all(USAGE.as_bytes());
            0
        }
        Ok(Invocation::Version) => crate::print_version("hccnrun"),
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
pub(super) static SIGNAL: AtomicI32 = AtomicI32::new(0);

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

pub(super) fn signal_name(sig: i32) -> &'static str {
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
pub(super) fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

pub(super) fn describe(status: ExitStatus) -> String {
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
enum Hosted {
    Embedded(Arc<StoreServer>),
    Etcd(crate::etcd_local::LocalEtcd),
}

/// Runs the job and returns hccnrun's exit code; `Err` only when it could not be set up.
pub fn run(o: &Options) -> Result<i32, String> {
    let started = Instant::now();
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    // The embedded store logs what it refuses (HCCN_LOG, to hccnrun's stderr).
    hccn_runtime::log::init(&cfg);
    limits::raise_open_files(limits::needed(o.world_size()));
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
            (Some(Hosted::Embedded(Arc::new(s))), url)
        }
    };
    let world = World::new(&store_url, token.as_bytes(), &cfg, &job_id);
    let keeps_keys = store_url.starts_with("etcd://") && hosted.is_none();
    let in_process = match &hosted {
        Some(Hosted::Embedded(s)) => Some(s.clone()),
        _ => None,
    };
    let roster = Arc::new(roster::Roster::new(&job_id, o.world_size(), in_process));
    let hccn = vec![("HCCN_STORE", store_url), ("HCCN_JOB_ID", job_id), ("HCCN_JOB_TOKEN", token)];
    let env = env::JobEnv::new(o, hccn, cfg.bind_addr)?;
    if let Some(dir) = &o.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("--output-dir {}: {e}", dir.display()))?;
    }
    let guard = guard::Guard::start()?;
    install_signal_handlers();
    let mut job = Job::new(o, world, roster, guard, env);
    if let Some(Hosted::Etcd(etcd)) = &hosted {
        job.own(etcd.process_group().unwrap_or(0));
    }
    for rank in o.node_rank * o.nranks..(o.node_rank + 1) * o.nranks {
        if let Err(e) = job.spawn(o, rank, None) {
            let (program, _) = o.command_line();
            let program = program.to_string_lossy();
            let hint = match (&o.python, e.kind()) {
                _ if program == o.program.to_string_lossy() => String::new(),
                (Some(_), io::ErrorKind::NotFound) => " (the interpreter --python names)".to_owned(),
                (None, io::ErrorKind::NotFound) => {
                    format!(" ({program}, which runs a .py program, is not on PATH; give --python)")
                }
                _ => String::new(),
            };
            say(format_args!("cannot start rank {rank} ({program}): {e}{hint}"));
            job.event(if e.kind() == io::ErrorKind::NotFound { 127 } else { 126 });
            job.stop(libc::SIGTERM);
            break;
        }
    }
    job.monitor(o, started);
    job.drain();
    let mut code = job.outcome(o.elastic.is_some());
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
    drop(job);
    drop(hosted);
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_like_a_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(11)), 139);
        assert_eq!(describe(ExitStatus::from_raw(9)), "was killed by signal 9 (SIGKILL)");
        assert_eq!(describe(ExitStatus::from_raw(3 << 8)), "exited with code 3");
    }
}
