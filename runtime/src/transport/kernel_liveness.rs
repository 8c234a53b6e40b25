//! What the kernel says about a silent peer on this host: evidence before time. A peer that
//! stopped (SIGSTOP, a debugger) is frozen and a pid that is gone is dead, both known at once;
//! a peer the kernel says is running or sleeping is alive, however starved, and is given more
//! patience than a peer nobody vouches for. The watchdog asks only about peers already silent
//! for a while (`Timing::probe_after`, half a heartbeat interval), at most once per
//! `probe_every`: with the defaults up to two reads of /proc/PID/stat per local peer per
//! 100 ms beat, in the second half of each interval.
//!
//! A pid means this process only if the peer shares our pid namespace and the pid was not
//! reused: each side says its pid and start time at the shared-memory handshake, and a pid
//! whose start time here differs is not used ([`Process::verified`]); a later mismatch means
//! the process exited and its pid went to another.

use std::time::Duration;

/// A peer's process as this rank sees it: its pid here and its start time (clock ticks after
/// boot), which tell it apart from a later process given the same pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Process {
    pub pid: i32,
    start: u64,
}

/// One reading of /proc/PID/stat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The state letter and the number of threads of a process that still exists.
    State { letter: u8, threads: u64 },
    /// No such process (it exited and was reaped, or its pid is another process's now).
    Gone,
    /// /proc could not be read (no /proc, no permission): no evidence either way.
    Unreadable,
}

/// What the kernel's word makes of a peer's silence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not silent long enough to ask.
    NotAsked,
    /// Stopped or traced: it will not answer until someone resumes it.
    Frozen,
    /// The process is gone (exited, killed, a zombie).
    Gone,
    /// Running or waiting: alive, perhaps starved of CPU; silence fails it only after
    /// [`Timing::alive_patience`].
    Alive,
    /// The kernel could not say: the time threshold alone decides (HCCN_DEAD_AFTER_MS).
    NoEvidence,
}

/// The thresholds, derived from HCCN_HEARTBEAT_MS and HCCN_DEAD_AFTER_MS.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// Silence after which the kernel is asked.
    pub probe_after: Duration,
    /// How often a peer still silent is asked again.
    pub probe_every: Duration,
    /// HCCN_DEAD_AFTER_MS.
    pub dead_after: Duration,
}

impl Timing {
    /// Asks after half a heartbeat interval of silence (at least 50 ms, so that a heartbeat a
    /// little late on a loaded host does not send every watcher to /proc), well before
    /// `dead_after`.
    pub fn new(every: Duration, dead_after: Duration) -> Timing {
        let probe_after = (every / 2).max(Duration::from_millis(50)).min(dead_after / 2);
        Timing { probe_after, probe_every: probe_after / 2, dead_after }
    }

    /// How long a peer the kernel says is alive may be silent, on a host asked for `overload`
    /// times its cores (starved.rs): a starved process is not dead, but one that says nothing
    /// for this long is hung (its watchdog cannot run at all). Four times `dead_after`, and up
    /// to four times that again while the host has that many more threads ready to run than
    /// CPUs: then every process waits its turn that much longer (1,024 ranks on 2 cores went
    /// 3.3-4.6 s without a turn).
    pub fn alive_patience(&self, overload: u32) -> Duration {
        4 * self.dead_after * overload.clamp(1, 4)
    }
}

/// The verdict on a peer silent for `silent` that the kernel saw as `seen`.
pub(crate) fn verdict(seen: Seen, silent: Duration, t: &Timing) -> Verdict {
    if silent < t.probe_after {
        return Verdict::NotAsked;
    }
    match seen {
        Seen::Gone => Verdict::Gone,
        Seen::Unreadable => Verdict::NoEvidence,
        Seen::State { letter: b'T' | b't', .. } => Verdict::Frozen,
        // A zombie leader with live threads is a process whose main thread exited: time decides.
        Seen::State { letter: b'Z' | b'X' | b'x', threads } if threads <= 1 => Verdict::Gone,
        Seen::State { letter: b'Z' | b'X' | b'x', .. } => Verdict::NoEvidence,
        // R, S, D, I, W, P, K: running or waiting.
        Seen::State { .. } => Verdict::Alive,
    }
}

/// The user's words for a verdict that fails a peer.
pub(crate) fn cause(v: Verdict, p: Process, silent: Duration) -> Option<String> {
    let ms = silent.as_millis();
    match v {
        Verdict::Frozen => {
            Some(format!("frozen: the process (pid {}) is stopped (SIGSTOP or a debugger); silent for {ms} ms", p.pid))
        }
        Verdict::Gone => Some(format!("dead: the process (pid {}) is gone; silent for {ms} ms", p.pid)),
        _ => None,
    }
}

/// The fields of /proc/PID/stat this module reads.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    state: u8,
    threads: u64,
    start: u64,
}

/// Parses /proc/PID/stat. The command name (field 2) may hold spaces and parentheses: the
/// fields that follow start after its last ')'.
fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Field k of proc(5) is f[k - 3]: state is 3, num_threads 20, starttime 22.
    let state = *f.first()?.as_bytes().first()?;
    Some(Stat { state, threads: f.get(17)?.parse().ok()?, start: f.get(19)?.parse().ok()? })
}

fn read_stat(pid: i32) -> Result<Stat, Seen> {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => parse_stat(&text).ok_or(Seen::Unreadable),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Seen::Gone),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Err(Seen::Gone),
        Err(_) => Err(Seen::Unreadable),
    }
}

impl Process {
    /// This process: its pid and start time, to tell peers at the handshake.
    pub fn mine() -> (i32, u64) {
        let pid = std::process::id() as i32;
        (pid, read_stat(pid).map_or(0, |s| s.start))
    }

    /// The peer that said it is `pid` started at `start`, if this rank sees that very process
    /// under that pid (the same pid namespace); else None, and its silence is judged by time.
    pub fn verified(pid: i32, start: u64) -> Option<Process> {
        let stat = read_stat(pid).ok()?;
        (pid > 0 && start != 0 && stat.start == start).then_some(Process { pid, start })
    }

    /// What the kernel says of it now.
    pub fn look(&self) -> Seen {
        match read_stat(self.pid) {
            Ok(s) if s.start != self.start => Seen::Gone,
            Ok(s) => Seen::State { letter: s.state, threads: s.threads },
            Err(seen) => seen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn state(letter: u8) -> Seen {
        Seen::State { letter, threads: 4 }
    }

    #[test]
    fn the_kernel_state_and_the_silence_give_the_verdict() {
        let t = Timing::new(ms(100), ms(800));
        assert_eq!((t.probe_after, t.probe_every), (ms(50), ms(25)));
        let zombie = Seen::State { letter: b'Z', threads: 1 };
        let cases = [
            // (seen, silent ms, verdict)
            (state(b'T'), 49, Verdict::NotAsked),
            (state(b'T'), 50, Verdict::Frozen),
            (state(b't'), 60, Verdict::Frozen),
            (Seen::Gone, 60, Verdict::Gone),
            (zombie, 60, Verdict::Gone),
            (state(b'Z'), 60, Verdict::NoEvidence),
            (state(b'R'), 60, Verdict::Alive),
            (state(b'S'), 5000, Verdict::Alive),
            (state(b'D'), 900, Verdict::Alive),
            (Seen::Unreadable, 60, Verdict::NoEvidence),
        ];
        for (seen, silent, want) in cases {
            assert_eq!(verdict(seen, ms(silent), &t), want, "{seen:?} silent {silent} ms");
        }
        // A running peer is never failed for silence shorter than HCCN_DEAD_AFTER_MS.
        assert!(t.alive_patience(1) >= t.dead_after);
    }

    #[test]
    fn a_running_peer_gets_more_patience_on_an_overloaded_host_within_a_bound() {
        let t = Timing::new(ms(100), ms(800));
        let cases = [(0, 3200), (1, 3200), (2, 6400), (3, 9600), (4, 12800), (500, 12800)];
        for (overload, want) in cases {
            assert_eq!(t.alive_patience(overload), ms(want), "overload {overload}");
        }
    }

    #[test]
    fn probing_starts_at_half_a_beat_not_before_50_ms_nor_after_half_the_dead_time() {
        assert_eq!(Timing::new(ms(10), ms(800)).probe_after, ms(50));
        assert_eq!(Timing::new(ms(400), ms(2000)).probe_after, ms(200));
        assert_eq!(Timing::new(ms(100), ms(60)).probe_after, ms(30));
    }

    #[test]
    fn stat_lines_parse_even_with_odd_command_names() {
        let mut line = String::from("4242 (a) b) (c) T 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 ");
        line.push_str("7 0 123456 99 100");
        assert_eq!(parse_stat(&line), Some(Stat { state: b'T', threads: 7, start: 123456 }));
        assert_eq!(parse_stat("4242 (x) S 1"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_is_seen_running_and_a_stale_start_time_is_gone() {
        let (pid, start) = Process::mine();
        let me = Process::verified(pid, start).expect("this process is readable in /proc");
        assert!(matches!(me.look(), Seen::State { letter: b'R' | b'S' | b'D', .. }), "{:?}", me.look());
        assert_eq!(Process::verified(pid, start + 1), None, "another start time: another process");
        assert_eq!(Process { pid, start: start + 1 }.look(), Seen::Gone);
        assert_eq!(Process { pid: i32::MAX, start }.look(), Seen::Gone);
    }
}
