//! The ranks hccnrun started on this host: spawning (with binding and the job's environment),
//! forwarding their output, watching for exits, grace and stopping, elastic replacements.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::world::{EarlyExits, World};

use super::*;

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
pub(super) struct Rank {
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
pub(super) enum Phase {
    Running,
    /// A rank failed; the others may finish until the deadline.
    Grace(Instant),
    /// Remaining ranks have been told to stop; SIGKILL follows at the deadline.
    Stopping(Instant),
    Killed,
}

pub(super) struct Job {
    pub(super) ranks: Vec<Rank>,
    /// The job's store, asked whether the world formed when ranks exit.
    pub(super) world: World,
    pub(super) early: EarlyExits,
    pub(super) readers: Vec<(u32, JoinHandle<()>)>,
    /// hccnrun's exit code, fixed by the first event that decides it.
    pub(super) outcome: Option<i32>,
    pub(super) phase: Phase,
    /// Replacements started so far (--elastic).
    pub(super) restarts: u32,
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
    pub(super) fn spawn(&mut self, o: &Options, rank: u32, env: &[(&str, String)]) -> io::Result<()> {
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
    pub(super) fn stop(&mut self, sig: i32) {
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
    pub(super) fn monitor(&mut self, o: &Options, env: &[(&str, String)], started: Instant) -> i32 {
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
    pub(super) fn drain(&mut self) {
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
