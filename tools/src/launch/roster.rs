//! Which rank each process hccnrun started holds now, read from the membership decisions that
//! a world made by `hccn_init_from_env` records in the job's store: after every shrink or
//! rebuild, `<world>/epochs/<e>` holds the ranks of epoch e-1 that were dropped (u32 each) and
//! the join tickets admitted (u64 each, consecutive), little endian. Survivors take dense ranks
//! in old-rank order and the admitted joiners the ranks after them, in ticket order (see
//! runtime/src/comm/join.rs, whose key names are repeated here). A joiner is matched to a process
//! through the address it published under `<world>/join/<ticket>/addr`: the process that holds a
//! socket bound to that address (its listener while it waits, the connections it accepted once
//! admitted) is found through /proc. Nothing is guessed: a process that cannot be matched (on
//! another host) keeps its label.
//!
//! Lines are labelled with the rank as hccnrun knows it when it forwards them. With the
//! embedded store (in this process) every line first checks for a new decision, which is
//! recorded before any member's shrink or rebuild returns, so a line written after one carries
//! the new rank; with a store elsewhere a watcher takes each decision in as it is recorded (so a
//! line written at once after one may still carry the old rank). A line written just before a
//! change but forwarded after it carries the new rank.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use hccn_runtime::sync::Locked;
use hccn_runtime::StoreServer;

/// How long a watcher waits for a key before it looks at `stop` again.
const KEY_WAIT: Duration = Duration::from_millis(200);

/// The label of one process's output: its rank, or what it is while it has none.
#[derive(Debug, Clone, Default)]
pub(super) struct Label(Arc<AtomicI64>);

impl Label {
    const JOINING: i64 = -1;
    const LEFT: i64 = -2;

    pub(super) fn rank(r: u32) -> Label {
        Label(Arc::new(AtomicI64::new(i64::from(r))))
    }

    pub(super) fn joining() -> Label {
        Label(Arc::new(AtomicI64::new(Label::JOINING)))
    }

    fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }

    /// The rank it holds, if any.
    pub(super) fn held(&self) -> Option<u32> {
        u32::try_from(self.0.load(Ordering::Relaxed)).ok()
    }

    /// `[R] `, `[joining] ` or `[left] `.
    pub(super) fn prefix(&self) -> String {
        match self.0.load(Ordering::Relaxed) {
            Label::JOINING => "[joining] ".into(),
            Label::LEFT => "[left] ".into(),
            r => format!("[{r}] "),
        }
    }
}

/// One process hccnrun started (an index into the job's ranks).
#[derive(Debug)]
struct Proc {
    /// Its process group (the pid of the process hccnrun started), `None` on another host.
    group: Option<i32>,
    label: Label,
    alive: bool,
    /// It has held a rank (so losing it means it was left out, not that it waits).
    held: bool,
}

#[derive(Debug, Default)]
struct State {
    /// The world's key prefix, once known.
    world: Option<String>,
    epoch: u64,
    size: u32,
    /// The first join ticket not admitted yet.
    next_ticket: u64,
    /// Rank -> process (None: a process of another host, or one not found).
    holders: Vec<Option<usize>>,
    procs: Vec<Proc>,
    /// Tickets matched to processes before their admission.
    matched: Vec<(u64, usize)>,
    /// A decision that does not read as expected: labels stay as they are from then on.
    lost: bool,
}

/// The job's view of who holds which rank.
#[derive(Debug)]
pub(super) struct Roster {
    job: String,
    /// The embedded store, when this process hosts it.
    hosted: Option<Arc<StoreServer>>,
    state: Mutex<State>,
}

/// What the roster reads in the job's store.
pub(super) trait Records {
    /// The value of `key`, `None` when it is not set (or the store does not answer).
    fn get(&mut self, key: &str) -> Option<Vec<u8>>;
    /// The generation of job `job` (its key root) whose processes are alive, if any.
    fn live_generation(&mut self, job: &str) -> Option<u64>;

    /// Whether `key` is set (cheaper than its value in some stores).
    fn has(&mut self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The value of `key`, waiting up to `timeout` for it to be set.
    fn wait(&mut self, key: &str, timeout: Duration) -> Option<Vec<u8>> {
        let _ = timeout;
        self.get(key)
    }
}

type Lookup<'a> = &'a mut dyn Records;

/// The embedded store, read in this process; it holds one generation.
struct Hosted<'a>(&'a StoreServer);

impl Records for Hosted<'_> {
    fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.0.find(key).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn live_generation(&mut self, _job: &str) -> Option<u64> {
        Some(hccn_runtime::rendezvous::runs::RunState::SINGLE.generation)
    }

    fn has(&mut self, key: &str) -> bool {
        // One lookup; `find` reads every key.
        self.0.contains(key)
    }
}

fn epoch_key(world: &str, epoch: u64) -> String {
    format!("{world}/epochs/{epoch}")
}

fn addr_key(world: &str, ticket: u64) -> String {
    format!("{world}/join/{ticket}/addr")
}

/// Splits a decision into (dropped ranks, admitted tickets): the tickets are `first_ticket`,
/// `first_ticket + 1`, ... and the dropped ranks strictly rising below `old_size`. A ticket read
/// as two u32 ends in a 0 after a non-zero value, which no rising list does, so at most one split
/// fits.
pub(super) fn decode(bytes: &[u8], old_size: u32, first_ticket: u64) -> Option<(Vec<u32>, Vec<u64>)> {
    (0..=bytes.len() / 8).find_map(|joiners| {
        let (head, tail) = bytes.split_at(bytes.len() - joiners * 8);
        let tickets: Vec<u64> =
            tail.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
        let consecutive = tickets.iter().enumerate().all(|(i, &t)| t == first_ticket + i as u64);
        if !consecutive || head.len() % 4 != 0 {
            return None;
        }
        let dropped: Vec<u32> =
            head.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap_or_default())).collect();
        let rising = dropped.windows(2).all(|w| w[0] < w[1]) && dropped.iter().all(|&r| r < old_size);
        rising.then_some((dropped, tickets))
    })
}

/// The holders of the next epoch: the survivors in old-rank order, then the joiners.
pub(super) fn next_holders(old: &[Option<usize>], dropped: &[u32], joiners: &[Option<usize>]) -> Vec<Option<usize>> {
    let survivors = old.iter().enumerate().filter(|(r, _)| !dropped.contains(&(*r as u32))).map(|(_, h)| *h);
    survivors.chain(joiners.iter().copied()).collect()
}

impl Roster {
    pub(super) fn new(job_id: &str, world_size: u32, hosted: Option<Arc<StoreServer>>) -> Roster {
        let job = hccn_runtime::rendezvous::runs::job_root(job_id);
        let state =
            State { size: world_size, next_ticket: 1, holders: vec![None; world_size as usize], ..State::default() };
        Roster { job, hosted, state: Mutex::new(state) }
    }

    /// Registers process `index` (the job's ranks, in start order): `slot` is the rank it was
    /// started as; a replacement holds none until it is admitted. `group`: its process group
    /// when it runs here.
    pub(super) fn add(&self, index: usize, slot: u32, replacement: bool, group: Option<i32>) -> Label {
        let mut s = self.state.locked();
        let label = if replacement { Label::joining() } else { Label::rank(slot) };
        if s.procs.len() <= index {
            s.procs.resize_with(index + 1, || Proc { group: None, label: Label::default(), alive: false, held: false });
        }
        s.procs[index] = Proc { group, label: label.clone(), alive: true, held: !replacement };
        if !replacement && s.epoch == 0 {
            if let Some(h) = s.holders.get_mut(slot as usize) {
                *h = Some(index);
            }
        }
        label
    }

    pub(super) fn exited(&self, index: usize) {
        if let Some(p) = self.state.locked().procs.get_mut(index) {
            p.alive = false;
        }
    }

    /// Whether process `index` holds a rank now.
    pub(super) fn is_member(&self, index: usize) -> bool {
        self.state.locked().procs.get(index).is_some_and(|p| p.label.held().is_some())
    }

    /// Whether process `index` has held a rank at some point.
    pub(super) fn was_member(&self, index: usize) -> bool {
        self.state.locked().procs.get(index).is_some_and(|p| p.held)
    }

    /// Per forwarded line: with the embedded store, takes a new decision into account first.
    pub(super) fn refresh(&self) {
        let Some(hosted) = &self.hosted else { return };
        {
            // The common case, a line with nothing new: one lookup in the store's map.
            let s = self.state.locked();
            let next = s.world.as_deref().map(|w| epoch_key(w, s.epoch + 1));
            if s.lost || next.is_some_and(|k| !hosted.contains(&k)) {
                return;
            }
        }
        self.update(&mut Hosted(hosted));
    }

    /// From the monitor, every round, with the embedded store: what no line has asked for yet
    /// (a store elsewhere has its watcher, [`Roster::watch_decisions`]).
    pub(super) fn poll(&self) {
        if let Some(hosted) = &self.hosted {
            self.update(&mut Hosted(hosted));
        }
    }

    /// The world's prefix: the first world of the job's live generation (asked until the ranks
    /// have entered one: what a store that outlives runs holds before belongs to an ended run).
    fn world(&self, s: &mut State, get: Lookup<'_>) -> Option<String> {
        if s.world.is_none() {
            let generation = get.live_generation(&self.job)?;
            s.world = Some(hccn_runtime::rendezvous::runs::world_prefix(&self.job, generation, 0));
        }
        s.world.clone()
    }

    fn update(&self, get: Lookup<'_>) {
        let mut s = self.state.locked();
        if s.lost {
            return;
        }
        let Some(world) = self.world(&mut s, get) else { return };
        loop {
            let key = epoch_key(&world, s.epoch + 1);
            let Some(decision) = get.has(&key).then(|| get.get(&key)).flatten() else { return };
            let Some((dropped, tickets)) = decode(&decision, s.size, s.next_ticket) else {
                crate::launch::say(format_args!(
                    "cannot read the membership decision of epoch {}; output stays labelled as of epoch {}",
                    s.epoch + 1,
                    s.epoch
                ));
                s.lost = true;
                return;
            };
            let joiners: Vec<Option<usize>> = tickets.iter().map(|&t| self.joiner(&mut s, &world, t, get)).collect();
            s.holders = next_holders(&s.holders, &dropped, &joiners);
            s.size = s.holders.len() as u32;
            s.next_ticket += tickets.len() as u64;
            s.epoch += 1;
            relabel(&mut s);
        }
    }

    /// The process that took join ticket `t`, if it runs here.
    fn joiner(&self, s: &mut State, world: &str, t: u64, get: Lookup<'_>) -> Option<usize> {
        if let Some(&(_, i)) = s.matched.iter().find(|(m, _)| *m == t) {
            return Some(i);
        }
        let addr: SocketAddr = String::from_utf8(get.get(&addr_key(world, t))?).ok()?.parse().ok()?;
        holder_of(s, addr)
    }

    /// Runs `step` with the world's prefix, in a thread named `name`, until `stop`: the
    /// roster's watchers, each waiting on one key of the store at a time (with a connection of
    /// its own, `records`).
    fn watcher(
        self: &Arc<Self>,
        name: &str,
        mut records: impl Records + Send + 'static,
        stop: Arc<AtomicBool>,
        mut step: impl FnMut(&Roster, &mut dyn Records, &str) + Send + 'static,
    ) -> std::io::Result<JoinHandle<()>> {
        let roster = self.clone();
        std::thread::Builder::new().name(name.into()).spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match roster.world_now(&mut records).filter(|_| !roster.state.locked().lost) {
                    Some(world) => step(&roster, &mut records, &world),
                    None => std::thread::sleep(KEY_WAIT),
                }
            }
        })
    }

    /// Matches each join ticket to its process as soon as the joiner publishes its address: a
    /// joiner may end moments after it is admitted (and its sockets with it), and a store that
    /// forgets admitted tickets may have dropped the address by the time the decision is read.
    pub(super) fn watch_tickets(
        self: &Arc<Self>,
        records: impl Records + Send + 'static,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<JoinHandle<()>> {
        let mut ticket = 0;
        self.watcher("hccnrun-tickets", records, stop, move |roster, records, world| {
            ticket = ticket.max(roster.state.locked().next_ticket);
            if let Some(addr) = records.wait(&addr_key(world, ticket), KEY_WAIT) {
                roster.match_ticket(ticket, &addr);
                ticket += 1;
            }
        })
    }

    /// With a store elsewhere, takes each decision in as soon as it is recorded (lines are not
    /// checked one by one there: that would ask the store for each).
    pub(super) fn watch_decisions(
        self: &Arc<Self>,
        records: impl Records + Send + 'static,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<JoinHandle<()>> {
        self.watcher("hccnrun-epochs", records, stop, |roster, records, world| {
            let next = epoch_key(world, roster.state.locked().epoch + 1);
            if records.wait(&next, KEY_WAIT).is_some() {
                roster.update(records);
            }
        })
    }

    /// Whether the store is this process's own (lines check it one by one).
    pub(super) fn in_process(&self) -> bool {
        self.hosted.is_some()
    }

    fn world_now(&self, get: Lookup<'_>) -> Option<String> {
        let mut s = self.state.locked();
        self.world(&mut s, get)
    }

    /// Ticket `t`'s joiner published `addr`: the process of ours that holds it, if any.
    fn match_ticket(&self, t: u64, addr: &[u8]) {
        let Some(addr) = std::str::from_utf8(addr).ok().and_then(|a| a.parse::<SocketAddr>().ok()) else { return };
        let mut s = self.state.locked();
        if let Some(i) = holder_of(&s, addr) {
            s.matched.push((t, i));
        }
        let first = s.next_ticket;
        s.matched.retain(|(m, _)| *m >= first);
    }
}

/// The process of ours, not holding a rank, that holds a socket bound to `addr`.
fn holder_of(s: &State, addr: SocketAddr) -> Option<usize> {
    let candidates: Vec<(usize, i32)> = s
        .procs
        .iter()
        .enumerate()
        .filter(|(i, p)| p.alive && !p.held && !s.holders.contains(&Some(*i)))
        .filter_map(|(i, p)| Some((i, p.group?)))
        .collect();
    sockets::holder(addr, &candidates)
}

/// Sets every process's label from the holders.
fn relabel(s: &mut State) {
    let holders = s.holders.clone();
    for (i, p) in s.procs.iter_mut().enumerate() {
        match holders.iter().position(|h| *h == Some(i)) {
            Some(r) => {
                p.label.set(r as i64);
                p.held = true;
            }
            None if p.held => p.label.set(Label::LEFT),
            None => p.label.set(Label::JOINING),
        }
    }
}

impl Records for crate::world::World {
    fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.value(key, Duration::ZERO)
    }

    fn wait(&mut self, key: &str, timeout: Duration) -> Option<Vec<u8>> {
        self.value(key, timeout)
    }

    fn live_generation(&mut self, job: &str) -> Option<u64> {
        self.live_generation(job)
    }
}

/// Finding the process that holds a TCP socket: its socket descriptors (from /proc), each
/// borrowed through a pidfd (`pidfd_getfd`) to read its address. hccnrun is the ranks' ancestor,
/// so it may (as a debugger may); /proc/net/tcp would list every socket of the host instead, and
/// a job that connects often leaves thousands there.
mod sockets {
    use std::net::{SocketAddr, TcpListener};
    use std::os::fd::{FromRawFd, OwnedFd};

    /// The process of `candidates` (index, process group leader) that, itself or a descendant
    /// (a program a wrapper started), holds a TCP socket bound to `addr`: listening, or accepted
    /// from that listener.
    pub(super) fn holder(addr: SocketAddr, candidates: &[(usize, i32)]) -> Option<usize> {
        candidates
            .iter()
            .find_map(|&(index, leader)| family(leader).into_iter().any(|p| holds(p, addr)).then_some(index))
    }

    /// `pid` and its descendants.
    fn family(pid: i32) -> Vec<i32> {
        let mut all = vec![pid];
        let mut i = 0;
        while i < all.len() && all.len() < 256 {
            let tasks = std::fs::read_dir(format!("/proc/{}/task", all[i])).into_iter().flatten().flatten();
            let kids: Vec<i32> = tasks
                .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                .flat_map(|l| l.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<i32>>())
                .collect();
            all.extend(kids);
            i += 1;
        }
        all
    }

    fn holds(pid: i32, addr: SocketAddr) -> bool {
        // SAFETY: pidfd_open takes a pid and flags; the result is a new descriptor or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        if raw < 0 {
            return false;
        }
        // SAFETY: `raw` is a descriptor just opened for us.
        let pidfd = unsafe { OwnedFd::from_raw_fd(raw) };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
        fds.flatten().any(|fd| {
            let is_socket = std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
            let Some(n) = fd.file_name().to_str().and_then(|n| n.parse::<i32>().ok()).filter(|_| is_socket) else {
                return false;
            };
            use std::os::fd::AsRawFd;
            // SAFETY: duplicates descriptor `n` of the process behind `pidfd` into this one.
            let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), n, 0) } as i32;
            if copy < 0 {
                return false;
            }
            // SAFETY: `copy` is a descriptor of ours; the listener owns (and closes) it. Its
            // address is read whatever kind of TCP socket it is; other kinds give an error.
            let sock = unsafe { TcpListener::from_raw_fd(copy) };
            sock.local_addr().is_ok_and(|a| a == addr)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(dropped: &[u32], tickets: &[u64]) -> Vec<u8> {
        dropped.iter().flat_map(|r| r.to_le_bytes()).chain(tickets.iter().flat_map(|t| t.to_le_bytes())).collect()
    }

    #[test]
    fn decisions_split_into_dropped_ranks_and_tickets() {
        let cases: [(&[u32], &[u64], u32, u64); 6] = [
            (&[], &[], 3, 1),
            (&[2], &[], 3, 1),
            (&[1], &[1], 3, 1),
            (&[], &[4, 5], 3, 4),
            (&[0, 2, 3], &[7], 4, 7),
            (&[0, 1], &[1, 2, 3], 2, 1),
        ];
        for (dropped, tickets, size, first) in cases {
            assert_eq!(decode(&bytes(dropped, tickets), size, first), Some((dropped.to_vec(), tickets.to_vec())));
        }
        assert_eq!(decode(&bytes(&[5], &[]), 3, 1), None, "rank 5 is not of a world of 3");
        assert_eq!(decode(&[1, 2, 3], 3, 1), None);
        assert_eq!(decode(&bytes(&[], &[9]), 3, 1), None, "tickets start where admission left off");
    }

    #[test]
    fn survivors_keep_their_order_and_joiners_follow() {
        let old = [Some(10), Some(11), None, Some(13)];
        assert_eq!(next_holders(&old, &[1], &[Some(20)]), [Some(10), None, Some(13), Some(20)]);
        assert_eq!(next_holders(&old, &[0, 3], &[]), [Some(11), None]);
    }

    #[test]
    fn a_listening_socket_names_its_process() {
        // This test process is its own candidate.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let addr = l.local_addr().expect("addr");
        let me = std::process::id() as i32;
        assert_eq!(sockets::holder(addr, &[(3, 0x3fff_ffff), (7, me)]), Some(7), "no such process 0x3fffffff");
        drop(l);
        assert_eq!(sockets::holder(addr, &[(7, me)]), None);
    }

    #[test]
    fn labels_follow_decisions() {
        let r = Roster::new("j", 3, None);
        let labels: Vec<Label> = (0..3).map(|i| r.add(i, i as u32, false, None)).collect();
        let joiner = r.add(3, 1, true, None);
        assert_eq!(joiner.prefix(), "[joining] ");
        struct Map(std::collections::HashMap<String, Vec<u8>>);
        impl Records for Map {
            fn get(&mut self, key: &str) -> Option<Vec<u8>> {
                self.0.get(key).cloned()
            }
            fn live_generation(&mut self, _: &str) -> Option<u64> {
                Some(4)
            }
        }
        let world = hccn_runtime::rendezvous::runs::world_prefix("job/j", 4, 0);
        let mut store = Map(std::collections::HashMap::new());
        store.0.insert(epoch_key(&world, 1), bytes(&[1], &[]));
        r.update(&mut store);
        let shown: Vec<String> = labels.iter().map(Label::prefix).collect();
        assert_eq!(shown, ["[0] ", "[left] ", "[1] "]);
        assert!(r.is_member(2) && !r.is_member(1) && !r.is_member(3));
    }
}
