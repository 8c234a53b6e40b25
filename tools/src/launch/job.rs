//! The ranks hccnrun started: spawning (with binding and the job's environment), their exits in
//! the order they happened, grace and stopping, elastic replacements, and the exit code.

use std::collections::HashSet;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::env::JobEnv;
use super::exits::{self, Ended};
use super::guard::{self, Guard};
use super::options::Options;
use super::output::{self, Files};
use super::roster::{Label, Roster};
use super::trampoline;
use super::{describe, exit_code, say, signal_name, SIGNAL};
use crate::hostfile;
use crate::world::{EarlyExits, World};

/// How stopped ranks get between SIGTERM and SIGKILL.
const TERM_TO_KILL: Duration = Duration::from_secs(1);
/// The longest the monitor sleeps between looks at signals, deadlines and the store.
const POLL: Duration = Duration::from_millis(15);
/// How often processes that ranks left behind (adopted by hccnrun) are reaped.
const REAP_EVERY: Duration = Duration::from_millis(500);
/// How long output may keep flowing after every rank has exited; only a descendant that left
/// its rank's process group can hold a pipe open that long.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);
const EXIT_TIMEOUT: i32 = 124;

/// One process hccnrun started. Its pid is also its process group id.
pub(super) struct Rank {
    /// The rank it was started as.
    slot: u32,
    pid: i32,
    child: Child,
    started: Instant,
    status: Option<ExitStatus>,
    /// When the kernel reported its end to the thread that waits for it.
    exited_at: Option<Instant>,
    /// hccnrun told it to stop: its end is not one that outlived a failure.
    stopped: bool,
    waiter: Option<JoinHandle<()>>,
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
}

/// A rank that failed (exited non-zero or by a signal) while the job was not being stopped.
#[derive(Debug, Clone, Copy)]
struct Failure {
    at: Instant,
    index: usize,
    code: i32,
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

pub(super) struct Job {
    pub(super) ranks: Vec<Rank>,
    /// The job's store, asked whether the world formed when ranks exit.
    pub(super) world: World,
    early: EarlyExits,
    roster: Arc<Roster>,
    guard: Guard,
    env: JobEnv,
    /// Other processes hccnrun started itself and waits for elsewhere (a local etcd).
    others: Vec<i32>,
    readers: Vec<(u32, JoinHandle<()>)>,
    exits: (Sender<Ended>, Receiver<Ended>),
    failures: Vec<Failure>,
    /// What decides the exit code by itself (a timeout, a signal to hccnrun, a rank gone before
    /// the world formed, a rank that cannot start), with when it happened.
    events: Vec<(Instant, i32)>,
    pub(super) phase: Phase,
    /// Replacements started so far (--elastic).
    restarts: u32,
    /// hccnrun sees every process of the world (one host, no remote ranks): only then can it
    /// tell that no member is left to admit a replacement.
    sees_all: bool,
    next_reap: Instant,
    /// The threads that follow membership in the store (roster.rs), and what stops them.
    watchers: (Arc<AtomicBool>, Vec<JoinHandle<()>>),
    /// Where each rank holds its lifeline (exits.rs).
    lifeline_fd: i32,
}

impl Job {
    pub(super) fn new(o: &Options, world: World, roster: Arc<Roster>, guard: Guard, env: JobEnv) -> Job {
        let remote = o.hosts.iter().flatten().any(|h| h.name != "localhost");
        let stop = Arc::new(AtomicBool::new(false));
        let mut watchers = Vec::new();
        match roster.watch_tickets(world.another(), stop.clone()) {
            Ok(t) => watchers.push(t),
            Err(e) => say(format_args!("cannot follow joining ranks ({e}); replacements stay labelled [joining]")),
        }
        if !roster.in_process() {
            match roster.watch_decisions(world.another(), stop.clone()) {
                Ok(t) => watchers.push(t),
                Err(e) => {
                    say(format_args!("cannot follow membership changes ({e}); output keeps the ranks it starts with"))
                }
            }
        }
        Job {
            ranks: Vec::new(),
            world,
            early: EarlyExits::default(),
            roster,
            guard,
            env,
            others: Vec::new(),
            readers: Vec::new(),
            exits: mpsc::channel(),
            failures: Vec::new(),
            events: Vec::new(),
            phase: Phase::Running,
            restarts: 0,
            sees_all: o.nnodes == 1 && !remote,
            next_reap: Instant::now(),
            watchers: (stop, watchers),
            lifeline_fd: exits::lifeline_fd(),
        }
    }

    /// Another process of hccnrun's own (not adopted from a rank).
    pub(super) fn own(&mut self, pid: i32) {
        self.others.push(pid);
    }

    /// Something that decides the exit code by itself happened now.
    pub(super) fn event(&mut self, code: i32) {
        self.events.push((Instant::now(), code));
    }

    /// The command that starts rank `slot`: here, or on its host from the host file through the
    /// remote command.
    fn command(&self, o: &Options, slot: u32, place: &hostfile::Place<'_>) -> io::Result<Command> {
        let vars = self.env.for_rank(slot, place);
        let (program, args) = o.command_line();
        let Some(host) = place.host else {
            let mut cmd = Command::new(&program);
            cmd.args(&args).envs(vars.iter().map(|(k, v)| (k, v)));
            return Ok(cmd);
        };
        // The remote side gets no environment of ours (ssh forwards none), so the settings
        // given to hccnrun travel on the command line.
        let forwarded = std::env::vars().filter(|(k, _)| k.starts_with("HCCN_") && !vars.iter().any(|(v, _)| v == k));
        let mut all: Vec<(String, String)> = forwarded.collect();
        all.extend(vars);
        let addr = hostfile::listen_addr(host).map_err(io::Error::other)?;
        all.retain(|(k, _)| k != "HCCN_BIND_ADDR");
        all.push(("HCCN_BIND_ADDR".into(), addr.to_string()));
        let argv = hostfile::remote_argv(&o.remote_cmd, host, &all, &program, &args).map_err(io::Error::other)?;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        Ok(cmd)
    }

    /// Starts rank `slot` (`restart`: the replacement's number, for --elastic).
    pub(super) fn spawn(&mut self, o: &Options, slot: u32, restart: Option<u32>) -> io::Result<()> {
        let place = o.place(slot).map_err(io::Error::other)?;
        let rank_cmd = self.command(o, slot, &place)?;
        let files = Files::create(o.output_dir.as_deref(), slot, restart)?;
        // Its end is timed by this pipe's hang-up (exits.rs); a rank without one is timed by
        // the kernel's notice.
        let lifeline = exits::lifeline().ok();
        let cpu = match place.host {
            None if o.bind_to_core => Some(core_for(place.local)?),
            _ => None,
        };
        let (life_read, life_write) = lifeline.map_or((None, None), |(r, w)| (Some(r), Some((w, self.lifeline_fd))));
        let mut cmd = trampoline::wrap(&rank_cmd, trampoline::Setup { cpu, lifeline: life_write })?;
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so that stopping a rank reaches whatever it started (a shell's
            // children, say) and a terminal's Ctrl-C reaches the ranks only through hccnrun.
            .process_group(0);
        let mut child = cmd.spawn()?;
        // Closes hccnrun's copy of the lifeline's write end: the rank's is the last.
        drop(cmd);
        let pid = child.id() as i32;
        self.guard.watch(pid);
        let index = self.ranks.len();
        let pipes = (child.stdout.take(), child.stderr.take());
        self.ranks.push(Rank {
            slot,
            pid,
            child,
            started: Instant::now(),
            status: None,
            exited_at: None,
            stopped: false,
            waiter: None,
        });
        let label = self.roster.add(index, slot, restart.is_some(), place.host.is_none().then_some(pid));
        let started = self.attend(index, life_read, pipes, files, label);
        if let Err(e) = started {
            // Without its waiter or readers the rank cannot be run: it goes at once.
            self.ranks[index].signal(libc::SIGKILL);
            self.ranks[index].stopped = true;
            if self.ranks[index].waiter.is_none() {
                self.reap(index, Instant::now());
            }
            return Err(e);
        }
        Ok(())
    }

    /// Starts the threads that wait for process `index`'s end and forward its output.
    fn attend(
        &mut self,
        index: usize,
        lifeline: Option<std::os::fd::OwnedFd>,
        pipes: (Option<ChildStdout>, Option<ChildStderr>),
        files: Files,
        label: Label,
    ) -> io::Result<()> {
        let (slot, pid) = (self.ranks[index].slot, self.ranks[index].pid);
        self.ranks[index].waiter = Some(exits::watch(index, slot, pid, lifeline, self.exits.0.clone())?);
        let streams = [(pipes.0.map(|p| Box::new(p) as Box<dyn io::Read + Send>), files.stdout, false, "out")]
            .into_iter()
            .chain([(pipes.1.map(|p| Box::new(p) as Box<dyn io::Read + Send>), files.stderr, true, "err")]);
        for (pipe, file, to_stderr, name) in streams {
            let Some(pipe) = pipe else { continue };
            let name = format!("rank{slot}-{name}");
            let t = output::start(name, label.clone(), self.roster.clone(), pipe, to_stderr, file)?;
            self.readers.push((slot, t));
        }
        Ok(())
    }

    fn running(&self) -> impl Iterator<Item = (usize, &Rank)> {
        self.ranks.iter().enumerate().filter(|(_, r)| r.status.is_none())
    }

    /// Whether a process that holds a rank in the world still runs.
    fn member_running(&self) -> bool {
        self.running().any(|(i, _)| self.roster.is_member(i))
    }

    /// hccnrun can tell that no member is left to admit a replacement.
    fn sees_members(&self) -> bool {
        self.sees_all && self.world.available()
    }

    fn signal_running(&mut self, sig: i32) {
        let ranks: Vec<String> = self.running().map(|(_, r)| r.slot.to_string()).collect();
        if ranks.is_empty() {
            return;
        }
        say(format_args!("sending {} to rank(s) {}", signal_name(sig), ranks.join(", ")));
        for r in self.ranks.iter_mut().filter(|r| r.status.is_none()) {
            r.signal(sig);
            r.stopped = true;
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

    /// Reaps process `index`, which ended at `at`: whatever it left running in its process group
    /// is killed first (nothing may outlive the job, and the unreaped leader keeps the group id
    /// from being reused until then).
    fn reap(&mut self, index: usize, at: Instant) -> Option<ExitStatus> {
        let r = &mut self.ranks[index];
        if r.status.is_some() {
            return None;
        }
        // SAFETY: the leader is ours and unreaped, so the group id is still this rank's.
        unsafe { libc::kill(-r.pid, libc::SIGKILL) };
        // The process has ended, so this returns at once; an error would mean someone else
        // reaped it, and it counts as a failure rather than leaving the job waiting for it.
        let status = r.child.wait().unwrap_or_else(|_| ExitStatus::from_raw(1 << 8));
        r.status = Some(status);
        r.exited_at = Some(at);
        if let Some(w) = r.waiter.take() {
            let _ = w.join();
        }
        self.guard.release(r.pid);
        self.roster.exited(index);
        Some(status)
    }

    /// With --elastic, decides what a failed rank means: a replacement while restarts last,
    /// enough ranks remain and a member is left to admit it (`true`), or the end of the job.
    fn recover(&mut self, o: &Options, index: usize) -> bool {
        let Some(el) = o.elastic else { return false };
        let slot = self.ranks[index].slot;
        if self.sees_members() && !self.member_running() {
            say(format_args!(
                "no member of the world is left to admit a replacement for rank {slot}; not starting one"
            ));
            return false;
        }
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
        say(format_args!("starting a replacement for rank {slot} (restart {} of {})", self.restarts, el.max_restarts));
        match self.spawn(o, slot, Some(self.restarts)) {
            Ok(()) => true,
            Err(e) => {
                say(format_args!("cannot start a replacement for rank {slot}: {e}"));
                false
            }
        }
    }

    /// A rank failed at `at`: recorded, and with --elastic replaced, or the job winds down.
    fn failed(&mut self, o: &Options, index: usize) {
        let (at, status) = (self.ranks[index].exited_at, self.ranks[index].status);
        let (Some(at), Some(status)) = (at, status) else { return };
        // A replacement that never became a member, failing once no member is left, only failed
        // to join a world that had ended: that is not the job's failure.
        let never_joined = o.elastic.is_some() && !self.roster.was_member(index);
        if never_joined && self.sees_members() && !self.member_running() {
            return;
        }
        self.failures.push(Failure { at, index, code: exit_code(status) });
        if self.phase == Phase::Running && !self.recover(o, index) {
            self.phase = Phase::Grace(Instant::now() + o.grace);
        }
    }

    /// The ranks that ended since the last call (waiting up to [`POLL`] for one), in the
    /// order they ended.
    fn ended(&mut self) -> Vec<Ended> {
        let mut batch: Vec<Ended> = self.exits.1.recv_timeout(POLL).into_iter().collect();
        batch.extend(self.exits.1.try_iter());
        batch.sort_by_key(|e| e.1);
        batch
    }

    /// Watches the ranks until every one has been reaped.
    pub(super) fn monitor(&mut self, o: &Options, started: Instant) {
        loop {
            let (mut failed, mut exited) = (Vec::new(), Vec::new());
            for (index, at) in self.ended() {
                let Some(status) = self.reap(index, at) else { continue };
                let r = &self.ranks[index];
                // Once the job is being stopped, ranks ending by our signals are expected.
                let stopping = matches!(self.phase, Phase::Stopping(_) | Phase::Killed) || r.stopped;
                if !status.success() && !stopping {
                    say(format_args!("rank {} (pid {}) {}", r.slot, r.pid, describe(status)));
                    failed.push(index);
                }
                if !stopping {
                    exited.push((r.slot, format!("(pid {}) {}", r.pid, describe(status)), exit_code(status)));
                }
            }
            // A rank gone before the world formed is one the others wait for until their timeout.
            if matches!(self.phase, Phase::Running | Phase::Grace(_)) {
                let running: Vec<u32> = self.running().map(|(_, r)| r.slot).collect();
                if let Some((why, code)) = self.early.check(&mut self.world, exited, &running) {
                    say(format_args!("{why}"));
                    self.event(code);
                    self.stop(libc::SIGTERM);
                }
            }
            for index in failed {
                self.failed(o, index);
            }
            self.watch_waiting_joiners(o);
            if self.running().next().is_none() {
                return;
            }
            self.on_signal_and_deadlines(o, started);
            self.housekeeping();
        }
    }

    /// With --elastic, replacements still running once no member is left have nobody to admit
    /// them: they get the grace period, then are stopped.
    fn watch_waiting_joiners(&mut self, o: &Options) {
        let waiting = o.elastic.is_some() && self.phase == Phase::Running && self.running().next().is_some();
        if waiting && self.sees_members() && !self.member_running() {
            let who: Vec<String> = self.running().map(|(_, r)| r.slot.to_string()).collect();
            say(format_args!(
                "no member of the world is left to admit the replacement(s) for rank(s) {}; they are stopped after the grace period",
                who.join(", ")
            ));
            self.phase = Phase::Grace(Instant::now() + o.grace);
        }
    }

    fn on_signal_and_deadlines(&mut self, o: &Options, started: Instant) {
        let now = Instant::now();
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            if matches!(self.phase, Phase::Stopping(_) | Phase::Killed) {
                say(format_args!("received {} again, killing ranks", signal_name(sig)));
                self.kill();
            } else {
                say(format_args!("received {}, stopping ranks", signal_name(sig)));
                self.event(128 + sig);
                self.stop(sig);
            }
        }
        if let Some(limit) = o.timeout {
            let in_time = matches!(self.phase, Phase::Running | Phase::Grace(_));
            if in_time && now.duration_since(started) >= limit {
                say(format_args!("timeout after {} s, stopping ranks", limit.as_secs_f64()));
                self.event(EXIT_TIMEOUT);
                self.stop(libc::SIGTERM);
            }
        }
        match self.phase {
            Phase::Grace(deadline) if now >= deadline => self.stop(libc::SIGTERM),
            Phase::Stopping(deadline) if now >= deadline => self.kill(),
            _ => {}
        }
    }

    /// What hccnrun started itself (its ranks, the watcher, a local etcd): never adopted.
    fn own_pids(&self) -> HashSet<i32> {
        let mut own: HashSet<i32> = self.ranks.iter().map(|r| r.pid).collect();
        own.insert(self.guard.pid());
        own.extend(self.others.iter().copied());
        own
    }

    /// Joins the threads of ranks that have ended (a thread's stack stays until it is joined),
    /// reaps adopted processes, and takes in membership changes no line has asked for yet.
    fn housekeeping(&mut self) {
        let (done, open): (Vec<_>, Vec<_>) = self.readers.drain(..).partition(|(_, t)| t.is_finished());
        self.readers = open;
        for (_, t) in done {
            let _ = t.join();
        }
        if Instant::now() >= self.next_reap {
            guard::reap_adopted(&self.own_pids());
            self.next_reap = Instant::now() + REAP_EVERY;
        }
        self.roster.poll();
    }

    /// After the last rank: ends what the ranks left behind, then joins the output threads so
    /// that every line reaches hccnrun's output before it exits.
    pub(super) fn drain(&mut self) {
        self.watchers.0.store(true, Ordering::Relaxed);
        for t in self.watchers.1.drain(..) {
            let _ = t.join();
        }
        guard::end_adopted(&self.own_pids(), DRAIN_LIMIT);
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

    /// Whether the job absorbed failure `f` (--elastic): a rank that was running when it happened
    /// exited 0 later, on its own (the others went on without it); or nothing else was running
    /// then, and the last to end before had exited 0 (the job had done its work: a straggler
    /// failed on its way out).
    fn absorbed(&self, f: &Failure) -> bool {
        let clean = |r: &Rank| !r.stopped && r.status.is_some_and(|s| s.success());
        let others = || self.ranks.iter().enumerate().filter(move |(i, _)| *i != f.index).map(|(_, r)| r);
        let running_then = |r: &&Rank| r.started < f.at && r.exited_at.is_none_or(|t| t > f.at);
        if others().filter(running_then).any(clean) {
            return true;
        }
        let before = others().filter(|r| r.exited_at.is_some_and(|t| t <= f.at)).max_by_key(|r| r.exited_at);
        others().find(running_then).is_none() && before.is_some_and(clean)
    }

    /// hccnrun's exit code: the earliest of the failures and of the events that decide it, 0
    /// when there is none. With --elastic a failure the job absorbed does not count.
    pub(super) fn outcome(&self, elastic: bool) -> i32 {
        let failures = self.failures.iter().filter(|f| !(elastic && self.absorbed(f))).map(|f| (f.at, f.code));
        failures.chain(self.events.iter().copied()).min_by_key(|(at, _)| *at).map_or(0, |(_, code)| code)
    }
}
