//! The watchdog of a world: it tells every peer at once of a peer this rank lost (a `Suspect`
//! frame), so that bystanders stop waiting for an operation that cannot complete; and, with
//! heartbeats on, it keeps the links alive and declares a peer silent for `dead_after` failed:
//! socket EOF catches processes that die, silence catches those that stop (SIGSTOP, a hung
//! host) and links that are cut without a reset. A silent peer is told so (`Evict`) before its
//! connection closes, so that if it was only frozen it learns on waking that it was left behind.
//! A link is alive while bytes arrive on it or its pulses do (pulse.rs): a slow link or a short
//! cut is slow, not dead.
//!
//! A silent peer on this host is judged by the kernel's word first (kernel_liveness.rs): a
//! stopped process is frozen and a vanished one dead, both at once; one the kernel says is
//! running is given more patience than time alone would. A silent peer on another host whose
//! host still delivers bytes (on any link, or pulses, to this rank or to a host-mate: vouch.rs)
//! is not cut off but queued behind a congested path: any byte is life, and only a whole host's
//! silence is judged by time; the peers on its host, which see its process, say if it froze.
//!
//! A rank watches only its `k` (HCCN_WATCHED_PEERS) nearest live ranks on each side in the ring of
//! world ranks: it heartbeats and pulses those and takes only their silence for a failure. The
//! load per rank is then constant at any size; a crash still shows on every link of the dead
//! process at once (the kernel closes its sockets), and a frozen rank is found by its watchers,
//! whose `Suspect` notice reaches every other rank within a heartbeat. A world of at most 2k+1
//! ranks watches every pair, as before. In a world that connects on demand (ondemand.rs), where a
//! rank has links to a few others only, this thread passes news it had not heard on to its links
//! (`Relay`), and takes the connections peers open on demand.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::kernel_liveness::{self, Process, Timing, Verdict};
use super::pulse::Pulse;
use super::shm::{HostId, Shm};
use super::vouch::{self, HostHeard};
use super::waker::{wait_readable, Waker};
use super::{news, Fault, Inbox, Link, LinkTable, OnDemand};
use crate::wire::{FrameHeader, FrameKind};

/// A thread per world of processes; stops (promptly) when dropped.
pub(crate) struct Watchdog {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
}

/// How often a notice that a busy link could not take is tried again.
const RETRY: Duration = Duration::from_millis(5);

impl Watchdog {
    /// `every` zero turns heartbeats, pulses and silence detection off (losses are still told).
    pub fn start(
        me: u32,
        peers: Arc<LinkTable>,
        inbox: Arc<Inbox>,
        pulse: Option<Arc<Pulse>>,
        (on_demand, shm, hosts): (Option<Arc<OnDemand>>, Arc<Shm>, Vec<Option<HostId>>),
        (every, dead_after, watched): (Duration, Duration, usize),
    ) -> Option<Self> {
        let waker = Waker::new().map_err(|e| tracing::error!("no watchdog (eventfd: {e})")).ok().map(Arc::new)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, inbox2, waker2) = (stop.clone(), inbox.clone(), waker.clone());
        let thread = std::thread::Builder::new()
            .name("hccn-watchdog".into())
            .spawn(move || {
                let w = Watch {
                    peers: &peers,
                    inbox: &inbox2,
                    pulse: pulse.as_deref(),
                    on_demand: on_demand.as_ref(),
                    shm: &shm,
                    hosts: &hosts,
                    waker: &waker2,
                    me,
                    watched,
                };
                w.run(every, dead_after, &stop2)
            })
            .map_err(|e| tracing::error!("no watchdog thread: silent peers will only time out: {e}"))
            .ok()?;
        inbox.set_announcer(waker.clone());
        Some(Watchdog { stop, waker, thread: Some(thread) })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            self.waker.wake();
            let _ = t.join();
        }
    }
}

fn header(kind: FrameKind, len: usize) -> FrameHeader {
    FrameHeader::control(kind, 0, 0, 0, len)
}

struct Watch<'a> {
    peers: &'a LinkTable,
    inbox: &'a Inbox,
    pulse: Option<&'a Pulse>,
    /// In a world that connects on demand: this thread also takes the peers' connections.
    on_demand: Option<&'a Arc<OnDemand>>,
    /// The shared-memory links, which know the processes of the peers on this host.
    shm: &'a Shm,
    /// Each world rank's host, where known (this rank's too).
    hosts: &'a [Option<HostId>],
    waker: &'a Waker,
    /// This process's world rank (names its trace file).
    me: u32,
    /// HCCN_WATCHED_PEERS.
    watched: usize,
}

/// The ranks `me` watches: the `k` nearest on either side in the ring of the `live` world ranks
/// (with `me`); all of them when they are at most 2k+1.
pub(crate) fn watched(me: u32, live: impl Iterator<Item = u32>, k: usize) -> HashSet<u32> {
    let mut ring: Vec<u32> = live.chain([me]).collect();
    ring.sort_unstable();
    ring.dedup();
    watched_in_ring(me, &ring, k)
}

/// [`watched`] over a ring already made: `ring` holds the live world ranks and `me`, ascending,
/// each once (the simulation of detection at thousands of ranks makes it once for all ranks).
pub(crate) fn watched_in_ring(me: u32, ring: &[u32], k: usize) -> HashSet<u32> {
    let n = ring.len();
    let at = ring.binary_search(&me).unwrap_or(0);
    let reach = k.min(n / 2);
    let mut out: HashSet<u32> = (1..=reach).flat_map(|d| [ring[(at + d) % n], ring[(at + n - d) % n]]).collect();
    out.remove(&me);
    out
}

/// Whether `me` watches `peer` among the `live` ranks (see [`watched`]).
pub(crate) fn watches(me: u32, peer: u32, live: impl Iterator<Item = u32>, k: usize) -> bool {
    watched(me, live.chain([peer]), k).contains(&peer)
}

impl Watch<'_> {
    /// A link that carries nothing for half of `dead_after` while its pulses keep coming is slow,
    /// not dead: it is logged once, and traced as a straggler link for as long as it lasts. Not
    /// when the peer's bytes wait in the socket: then this rank's reader is behind (a starved
    /// thread, a process busy exiting), not the link.
    fn note_slow(
        &self,
        slow: &mut std::collections::HashMap<u32, std::time::Instant>,
        rank: u32,
        on: &dyn Link,
        pulse: Option<Duration>,
        (every, dead_after): (Duration, Duration),
    ) {
        let link = on.silent_for();
        // Only a link to another host can be slow: a silence to a peer on this one (loopback,
        // shared memory) is a starved process, which the kernel speaks for (1,024 ranks on 2
        // cores warned 14,000 times of slow loopback links).
        let remote = self.host(rank).is_some();
        let is_slow = remote && link > dead_after / 2 && pulse.is_some_and(|p| p <= 3 * every) && !on.has_unread();
        match (is_slow, slow.get(&rank).copied()) {
            (true, None) => {
                tracing::warn!(
                    peer = rank,
                    "slow link: nothing on it for {} ms while its pulses come",
                    link.as_millis()
                );
                slow.insert(rank, std::time::Instant::now().checked_sub(link).unwrap_or_else(std::time::Instant::now));
            }
            (false, Some(since)) => {
                slow.remove(&rank);
                crate::trace::straggler(crate::trace::started_ago(since.elapsed()), self.me, rank);
            }
            _ => {}
        }
    }

    fn run(&self, every: Duration, dead_after: Duration, stop: &AtomicBool) {
        let mut w = Watching::default();
        let mut next_beat = std::time::Instant::now();
        while !stop.load(Ordering::SeqCst) {
            self.pass_news(&mut w.pending);
            if let Some(p) = self.pulse {
                let addrs = self.inbox.pulse_ranks();
                p.receive(self.peers.len(), &|from| addrs.iter().find(|(_, a)| *a == from).map(|(r, _)| *r));
            }
            // Only news wakes a watchdog without heartbeats.
            let mut nap = Duration::from_secs(3600);
            if !every.is_zero() {
                if std::time::Instant::now() >= next_beat {
                    // Pulses and news wake this thread often; the beats' own rhythm shows how
                    // late it runs.
                    w.lateness.woke(next_beat, std::time::Instant::now(), super::starved::queue_wait());
                    next_beat = std::time::Instant::now() + every;
                    self.beat(&mut w);
                }
                let judge_in = self.judge(&mut w, every, dead_after);
                nap = next_beat.saturating_duration_since(std::time::Instant::now()).min(judge_in);
            }
            if !w.pending.is_empty() {
                nap = RETRY;
            }
            let listener = self.on_demand.and_then(|on| on.listener());
            let fds: smallvec::SmallVec<[std::os::fd::RawFd; 3]> =
                [Some(self.waker.fd()), self.pulse.map(Pulse::fd), listener].into_iter().flatten().collect();
            wait_readable(&fds, nap);
            self.waker.clear();
            if let Some(on) = self.on_demand {
                on.accept();
            }
        }
    }

    /// Queues the notices the links must carry: this rank's losses to every live peer, news
    /// heard to pass on (a world that connects on demand), abandoned operations and revokes to
    /// forward; then hands each link what it takes now.
    fn pass_news(&self, pending: &mut Vec<(u32, FrameHeader, Vec<u8>)>) {
        let (peers, inbox) = (self.peers, self.inbox);
        let lost = inbox.announcements();
        let failed = inbox.failed();
        if !lost.is_empty() {
            let payload = news::encode(&inbox.by_id(lost));
            let live = peers.all().into_iter().filter(|(r, _)| !failed.contains_key(r));
            let hdr = header(FrameKind::Suspect, payload.len());
            pending.extend(live.map(|(r, _)| (r, hdr, payload.clone())));
        }
        for relay in inbox.relays() {
            let Some(reporter) = inbox.id_of(relay.reporter) else { continue };
            let payload = news::encode_relay(reporter, &inbox.by_id(relay.faults));
            let to = peers.all().into_iter().map(|(r, _)| r);
            let to = to.filter(|r| *r != relay.via && *r != relay.reporter && !failed.contains_key(r));
            let hdr = header(FrameKind::Relay, payload.len());
            pending.extend(to.map(|r| (r, hdr, payload.clone())));
        }
        for f in inbox.forwards() {
            let to = peers.all().into_iter().map(|(r, _)| r).filter(|r| *r != f.via && !failed.contains_key(r));
            pending.extend(to.map(|r| (r, f.hdr, f.payload.clone())));
        }
        pending.retain(|(rank, hdr, payload)| match peers.get(*rank) {
            Some(link) if !failed.contains_key(rank) => !link.control(hdr, payload),
            _ => false,
        });
    }

    /// Chooses the peers to watch (the ring closes over failed ranks) and heartbeats them, on
    /// their links and with pulses.
    fn beat(&self, w: &mut Watching) {
        let failed = self.inbox.failed();
        let all = self.peers.all();
        let candidates: Vec<u32> = match self.on_demand {
            // Every rank of the world, linked or not: the ring closes over a failed neighbour
            // to the next live rank, which this one then connects to.
            Some(_) => (0..self.peers.len() as u32).filter(|&r| r != self.me).collect(),
            None => all.iter().map(|(r, _)| *r).collect(),
        };
        let live = candidates.into_iter().filter(|r| !w.declared.contains(r) && !failed.contains_key(r));
        w.watching = watched(self.me, live, self.watched);
        w.since.update(&w.watching);
        if let Some(on) = self.on_demand {
            w.watching.iter().filter(|&&r| self.peers.get(r).is_none()).for_each(|&r| on.connect_aside(r));
        }
        if let Some(p) = self.pulse {
            let ranks = self.inbox.pulse_ranks().into_iter();
            let to: Vec<_> = ranks.filter(|(r, _)| w.watching.contains(r)).map(|(_, a)| a).collect();
            p.send(&to);
            super::usage::heartbeats_sent(to.len());
        }
        for (_, link) in all.iter().filter(|(rank, _)| w.watching.contains(rank)) {
            link.heartbeat();
            super::usage::heartbeats_sent(1);
        }
    }

    /// Declares failed each watched peer silent for longer than it may be; returns how soon the
    /// next one could be. Judged at every wake-up, not at beats only: a beat apart, a frozen
    /// peer was found up to a beat late.
    fn judge(&self, w: &mut Watching, every: Duration, dead_after: Duration) -> Duration {
        let failed = self.inbox.failed();
        let timing = Timing::new(every, dead_after);
        let mut next = every;
        // How overloaded the host is, read once per pass and only for a peer the kernel says
        // is running.
        let mut overload = None;
        let all = self.peers.all();
        // The kernel is asked about watched links only: the others carry no heartbeats.
        let kernel_in = &mut w.kernel_in;
        let heard: Vec<Duration> = all
            .iter()
            .map(|(r, l)| self.heard(w.watching.contains(r).then_some(&mut *kernel_in), *r, l.as_ref(), every))
            .collect();
        let hosts_heard = self.hosts_heard(&all, &heard);
        self.shm.publish_heard(hosts_heard.iter().map(|(h, d)| (vouch::tag(h), *d)));
        for ((rank, link), heard) in all.into_iter().zip(heard) {
            if !w.watching.contains(&rank) || w.declared.contains(&rank) || failed.contains_key(&rank) {
                continue;
            }
            let silent = heard.min(w.since.watched_for(rank));
            let pulse = self.pulse.and_then(|p| p.silent_for(rank));
            self.note_slow(&mut w.slow, rank, link.as_ref(), pulse, (every, dead_after));
            let (verdict, process, ask_in) = self.ask_kernel(&mut w.asked, rank, silent, &timing);
            next = next.min(ask_in.saturating_add(Duration::from_millis(1)));
            let fault = match process.and_then(|p| kernel_liveness::cause(verdict, p, silent)) {
                Some(why) if verdict == Verdict::Gone => Fault::sure(why),
                Some(why) => Fault::cut(why),
                None => {
                    // Patience never falls below `dead_after`: the host's evidence is looked for
                    // only then.
                    let host = match silent > dead_after {
                        true => self.host_heard(rank, &hosts_heard, dead_after),
                        false => HostHeard::Silent,
                    };
                    let overload = match verdict {
                        Verdict::Alive => *overload.get_or_insert_with(super::starved::overload),
                        _ => 1,
                    };
                    let patience = patience(verdict, link.heard_yet(), host.heard(), &timing, overload);
                    let allowed = patience + w.lateness.allowance(std::time::Instant::now());
                    if silent <= allowed {
                        next = next.min(allowed - silent + Duration::from_millis(1));
                        continue;
                    }
                    Fault::cut(silence(verdict, host, silent))
                }
            };
            // Bytes waiting in the socket mean the peer spoke and our reader is merely behind (a
            // starved thread on a loaded machine): they are read first, even from a process that
            // is gone since (its last data, its goodbye), and its end is then read as such.
            if link.has_unread() {
                continue;
            }
            self.declare(w, rank, link.as_ref(), fault);
        }
        next
    }

    /// How long ago peer `rank` was heard: on its link (bytes read, or segments the kernel
    /// received) or by its pulses, whichever was last.
    fn heard(&self, kernel_in: Option<&mut KernelIn>, rank: u32, link: &dyn Link, every: Duration) -> Duration {
        let pulse = self.pulse.and_then(|p| p.silent_for(rank));
        let heard = pulse.map_or(link.silent_for(), |p| p.min(link.silent_for()));
        kernel_in.map_or(heard, |k| heard.min(k.heard(rank, link, heard, every)))
    }

    /// The host of peer `rank` when it is another than this rank's.
    fn host(&self, rank: u32) -> Option<HostId> {
        let mine = self.hosts.get(self.me as usize).copied().flatten();
        self.hosts.get(rank as usize).copied().flatten().filter(|h| Some(*h) != mine)
    }

    /// How the host of remote peer `rank` is heard: by this rank (on any of its links), or by a
    /// host-mate (vouch.rs), within `dead_after`.
    fn host_heard(
        &self,
        rank: u32,
        hosts_heard: &std::collections::HashMap<HostId, Duration>,
        dead_after: Duration,
    ) -> HostHeard {
        let Some(host) = self.host(rank) else { return HostHeard::Silent };
        let own = hosts_heard.get(&host).copied();
        let mates = || self.shm.mates_heard(vouch::tag(&host));
        match own.is_some_and(|d| d < dead_after) {
            true => HostHeard::ByMe,
            false => vouch::host_heard(own, mates(), dead_after),
        }
    }

    /// How long ago each other host was heard (`heard`: each of `all`'s), by any of its ranks.
    fn hosts_heard(
        &self,
        all: &[(u32, Arc<dyn Link>)],
        heard: &[Duration],
    ) -> std::collections::HashMap<HostId, Duration> {
        let mut out = std::collections::HashMap::new();
        for ((rank, _), &s) in all.iter().zip(heard) {
            if let Some(h) = self.host(*rank) {
                out.entry(h).and_modify(|d: &mut Duration| *d = (*d).min(s)).or_insert(s);
            }
        }
        out
    }

    /// Declares `rank` failed: tells it so (`Evict`), should it wake and read, then closes.
    fn declare(&self, w: &mut Watching, rank: u32, link: &dyn Link, fault: Fault) {
        w.declared.insert(rank);
        w.asked.remove(&rank);
        let evict = news::encode_reason(&fault.reason);
        link.control(&header(FrameKind::Evict, evict.len()), &evict);
        self.inbox.mark_failed(rank, fault);
        link.close(None);
    }

    /// The kernel's word on peer `rank`, silent for `silent`, when it runs on this host and
    /// this rank sees its process; /proc is read only for a peer silent a while, at most once
    /// per `probe_every`. Returns the verdict, the process, and how soon to ask again.
    fn ask_kernel(
        &self,
        asked: &mut Asked,
        rank: u32,
        silent: Duration,
        t: &Timing,
    ) -> (Verdict, Option<Process>, Duration) {
        let Some(process) = self.shm.process(rank) else { return (Verdict::NoEvidence, None, Duration::MAX) };
        if silent < t.probe_after {
            asked.remove(&rank);
            return (Verdict::NotAsked, Some(process), t.probe_after - silent);
        }
        let now = std::time::Instant::now();
        let (at, verdict) = match asked.get(&rank) {
            Some(&(at, v)) if now.duration_since(at) < t.probe_every => (at, v),
            _ => (now, kernel_liveness::verdict(process.look(), silent, t)),
        };
        asked.insert(rank, (at, verdict));
        (verdict, Some(process), t.probe_every.saturating_sub(now.duration_since(at)))
    }
}

/// How long a watched peer may be silent. One not heard from yet may still be finishing its
/// set-up (hundreds of ranks on a few cores finish it far apart): four times `dead_after`. One
/// the kernel says is running is alive, however starved: four times too, and more on a host
/// `overload`ed (kernel_liveness.rs). One on a host still
/// heard (`host_heard`: by this rank or a host-mate, vouch.rs) is behind a congested path, not
/// cut off, and its host's ranks watch its process: eight times, a backstop only. Otherwise
/// `dead_after`.
fn patience(verdict: Verdict, heard_yet: bool, host_heard: bool, t: &Timing, overload: u32) -> Duration {
    match verdict {
        Verdict::Alive => t.alive_patience(overload),
        _ if host_heard => 8 * t.dead_after,
        _ if heard_yet => t.dead_after,
        _ => 4 * t.dead_after,
    }
}

/// Why a peer silent for `silent` is failed, in the user's words.
fn silence(verdict: Verdict, host: HostHeard, silent: Duration) -> String {
    let ms = silent.as_millis();
    match (verdict, host) {
        (Verdict::Alive, _) => format!("silent for {ms} ms although its process is running: hung"),
        (_, HostHeard::ByMe) => format!("silent for {ms} ms while its host's other ranks are heard: hung"),
        (_, HostHeard::ByMate) => format!("silent for {ms} ms while this host's other ranks hear its host: hung"),
        _ => format!("silent for {ms} ms: frozen, hung or cut off (HCCN_DEAD_AFTER_MS)"),
    }
}

/// When the kernel was last asked about each silent peer, and what it said.
type Asked = std::collections::HashMap<u32, (std::time::Instant, Verdict)>;

/// What the watchdog keeps between wake-ups.
#[derive(Default)]
struct Watching {
    /// The peers watched, as chosen at the last beat.
    watching: HashSet<u32>,
    /// Peers this watchdog declared failed.
    declared: HashSet<u32>,
    /// Links found slow (nothing on them while their pulses come), since when.
    slow: std::collections::HashMap<u32, std::time::Instant>,
    /// Notices (suspicions, news passed on) each link still has to take.
    pending: Vec<(u32, FrameHeader, Vec<u8>)>,
    lateness: super::starved::Lateness,
    since: WatchedSince,
    /// The kernel's word on silent peers of this host.
    asked: Asked,
    /// Segments received on silent links.
    kernel_in: KernelIn,
}

/// What the kernel received on links silent a while: segments of the peer's bytes that reached
/// this host are life even when none can be read yet. A deep queue (a congested path) that drops
/// one segment holds those behind it out of order until the resent one crosses the queue again,
/// for seconds; the bytes still arrive all along.
#[derive(Default)]
struct KernelIn(std::collections::HashMap<u32, (u32, Option<std::time::Instant>)>);

impl KernelIn {
    /// How long ago the kernel last received a segment from `rank`, as far as this watchdog
    /// saw it change (a link silent less than two beats is not asked); `silent` if it did not.
    fn heard(&mut self, rank: u32, link: &dyn Link, silent: Duration, every: Duration) -> Duration {
        if silent < 2 * every {
            self.0.remove(&rank);
            return silent;
        }
        let Some(segs) = link.segments_in() else { return silent };
        let now = std::time::Instant::now();
        let seen = self.0.entry(rank).or_insert((segs, None));
        if seen.0 != segs {
            *seen = (segs, Some(now));
        }
        seen.1.map_or(silent, |at| now.duration_since(at))
    }
}

/// When this rank began to watch each peer it watches. A peer it begins to watch (a neighbour
/// failed, the ring closed up) owed it nothing before: it may not even know yet of the failure
/// that made them neighbours. Its silence counts from then, not from its last frame.
#[derive(Default)]
struct WatchedSince(std::collections::HashMap<u32, std::time::Instant>);

impl WatchedSince {
    fn update(&mut self, watching: &HashSet<u32>) {
        let now = std::time::Instant::now();
        self.0.retain(|r, _| watching.contains(r));
        watching.iter().for_each(|&r| {
            self.0.entry(r).or_insert(now);
        });
    }

    fn watched_for(&self, rank: u32) -> Duration {
        self.0.get(&rank).map_or(Duration::MAX, std::time::Instant::elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(s: HashSet<u32>) -> Vec<u32> {
        let mut v: Vec<u32> = s.into_iter().collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn silence_is_judged_by_time_only_when_nothing_else_speaks_for_the_peer() {
        let t = Timing::new(Duration::from_millis(100), Duration::from_millis(800));
        let ms = |v: u64| Duration::from_millis(v);
        let cases = [
            // (kernel verdict, heard yet, its host heard, patience ms)
            (Verdict::NoEvidence, true, false, 800),
            (Verdict::NotAsked, true, false, 800),
            (Verdict::NoEvidence, false, false, 3200),
            (Verdict::Alive, true, false, 3200),
            (Verdict::NoEvidence, true, true, 6400),
            (Verdict::Alive, true, true, 3200),
        ];
        for (v, heard_yet, host_heard, want) in cases {
            assert_eq!(
                patience(v, heard_yet, host_heard, &t, 1),
                ms(want),
                "{v:?} heard {heard_yet} host {host_heard}"
            );
        }
        // Only a peer the kernel says is running waits longer on an overloaded host.
        assert_eq!(patience(Verdict::Alive, true, false, &t, 3), ms(9600));
        assert_eq!(patience(Verdict::NoEvidence, true, false, &t, 3), ms(800));
    }

    #[test]
    fn small_worlds_watch_every_pair_large_ones_k_neighbours_each_side() {
        // Up to 2k+1 ranks: everyone.
        assert_eq!(sorted(watched(2, 0..7, 3)), [0, 1, 3, 4, 5, 6]);
        assert_eq!(sorted(watched(0, 0..2, 3)), [1]);
        assert!(watched(0, 0..1, 3).is_empty());
        // 128 ranks, k = 3: three on each side, around the ring.
        assert_eq!(sorted(watched(0, 0..128, 3)), [1, 2, 3, 125, 126, 127]);
        assert_eq!(sorted(watched(64, 0..128, 2)), [62, 63, 65, 66]);
        // Failed ranks are not in the live ring: the next live ones take their place.
        let live = (0..16).filter(|r| ![5, 6].contains(r));
        assert_eq!(sorted(watched(4, live, 2)), [2, 3, 7, 8]);
        // Symmetric: whoever I watch watches me, so both ends of each watched link heartbeat it.
        for me in 0..20 {
            for peer in watched(me, 0..20, 3) {
                assert!(watches(peer, me, 0..20, 3), "{me} watches {peer} but not back");
            }
        }
    }
}
