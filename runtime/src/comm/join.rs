//! Growing a world: replacement processes wait in a join queue in the store, and
//! `rebuild` (shrink plus admission) makes them members at the next epoch.
//!
//! Keys under the world's prefix P: `P/formed` (the world exists, so later arrivals are
//! joiners), `P/join/next` (ticket counter), `P/join/<t>/addr` (joiner t's listening address),
//! `P/join/<t>/admit` (its admission: id, epoch, rank, size, the other joiners),
//! `P/join/admitted` (the last ticket admitted), and `P/epochs/<e>` (the decision for epoch e,
//! written once by compare-and-swap). Survivors connect to the joiners they admit;
//! a joiner accepts from every lower rank and connects to the joiners after it.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use super::{agree, derive_id, CommInner, Communicator, Origin};
use crate::collectives::{Op, Ptr};
use crate::error::{Error, ErrorKind, Result};
use crate::rendezvous::bootstrap;
use crate::rendezvous::Store;
use crate::transport::{tcp, Inbox, Link, Net};
use crate::tuning::LinkCosts;
use crate::types::DataType;

pub(crate) fn formed_key(prefix: &str) -> String {
    format!("{prefix}/formed")
}

fn next_key(prefix: &str) -> String {
    format!("{prefix}/join/next")
}

fn addr_key(prefix: &str, ticket: u64) -> String {
    format!("{prefix}/join/{ticket}/addr")
}

fn admit_key(prefix: &str, ticket: u64) -> String {
    format!("{prefix}/join/{ticket}/admit")
}

fn epoch_key(prefix: &str, epoch: u64) -> String {
    format!("{prefix}/epochs/{epoch}")
}

fn admitted_key(prefix: &str) -> String {
    format!("{prefix}/join/admitted")
}

/// What a joiner learns when admitted; also what survivors learn of the joiners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Admission {
    pub(crate) id: u64,
    pub(crate) epoch: u64,
    pub(crate) survivors: u32,
    /// Admitted joiners in rank order (rank = survivors + index): ticket and address.
    pub(crate) joiners: Vec<(u64, String)>,
}

impl Admission {
    fn size(&self) -> u32 {
        self.survivors + self.joiners.len() as u32
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.id.to_le_bytes());
        b.extend_from_slice(&self.epoch.to_le_bytes());
        b.extend_from_slice(&self.survivors.to_le_bytes());
        b.extend_from_slice(&(self.joiners.len() as u32).to_le_bytes());
        for (t, addr) in &self.joiners {
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(&(addr.len() as u32).to_le_bytes());
            b.extend_from_slice(addr.as_bytes());
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Admission> {
        let bad = || Error::new(ErrorKind::Store, "malformed admission record in the store");
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8]> {
            let s = b.get(at..at + n).ok_or_else(bad)?;
            at += n;
            Ok(s)
        };
        let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or_default());
        let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap_or_default());
        let id = u64_(take(8)?);
        let epoch = u64_(take(8)?);
        let survivors = u32_(take(4)?);
        let n = u32_(take(4)?);
        if n > 1 << 16 {
            return Err(bad());
        }
        let mut joiners = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let t = u64_(take(8)?);
            let len = u32_(take(4)?) as usize;
            let addr = String::from_utf8(take(len)?.to_vec()).map_err(|_| bad())?;
            joiners.push((t, addr));
        }
        Ok(Admission { id, epoch, survivors, joiners })
    }
}

/// How often a joiner checks, while it waits, that the world's run is still alive.
const ALIVE_EVERY: Duration = Duration::from_millis(250);

/// Waits up to `timeout` for ticket `ticket`'s admission; `None` once `alive` says no.
fn wait_for_admission(
    store: &dyn Store,
    prefix: &str,
    ticket: u64,
    timeout: Duration,
    alive: &dyn Fn() -> bool,
) -> Result<Option<Admission>> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match store.get(&admit_key(prefix, ticket), left.min(ALIVE_EVERY)) {
            Ok(record) => return Admission::decode(&record).map(Some),
            Err(e) if e.kind() == ErrorKind::Timeout && !left.is_zero() => {
                if !alive() {
                    return Ok(None);
                }
            }
            Err(e) if e.kind() == ErrorKind::Timeout => {
                return Err(Error::timeout(format!(
                    "not admitted within {} ms (the survivors call hccn_comm_rebuild to admit waiting ranks)",
                    timeout.as_millis()
                )))
            }
            Err(e) => return Err(e.context("waiting in the join queue")),
        }
    }
}

fn parse_addr(text: &str) -> Result<SocketAddr> {
    text.parse().map_err(|_| Error::new(ErrorKind::Store, format!("bad joiner address {text:?} in the store")))
}

/// Connects to the joiners ranked above `rank` and returns their links' sockets by rank.
fn connect_joiners(
    adm: &Admission,
    rank: u32,
    token: &[u8],
    cfg: &crate::config::Config,
) -> Result<Vec<(u32, TcpStream)>> {
    let mut out = Vec::new();
    for (k, (_, addr)) in adm.joiners.iter().enumerate() {
        let peer = adm.survivors + k as u32;
        if peer > rank {
            let addr = parse_addr(addr)?;
            out.push((peer, bootstrap::connect_peer(&|| Ok(addr), peer, adm.id, rank, adm.size(), token, cfg)?));
        }
    }
    Ok(out)
}

impl Communicator {
    /// Joins an existing world as a replacement: takes a ticket, waits up to `HCCN_TIMEOUT_MS` to
    /// be admitted by the survivors' `rebuild`, then connects to every member. `None` when
    /// `alive` says, while it waits, that the world's run has ended (init.rs starts afresh).
    pub(crate) fn join(
        store: &dyn Store,
        origin: Arc<Origin>,
        alive: &dyn Fn() -> bool,
    ) -> Result<Option<Communicator>> {
        let _span = tracing::info_span!("join", prefix = %origin.prefix).entered();
        let (prefix, cfg, token) = (&origin.prefix, &origin.cfg, &origin.token);
        let ticket = store.add(&next_key(prefix), 1)? as u64;
        let listener = TcpListener::bind((cfg.bind_addr, 0))
            .map_err(|e| Error::io(ErrorKind::System, format!("listen on {}", cfg.bind_addr), &e))?;
        let addr = listener.local_addr().map_err(|e| Error::io(ErrorKind::System, "listen address", &e))?;
        store.set(&addr_key(prefix, ticket), addr.to_string().as_bytes())?;
        tracing::info!(ticket, "waiting in the join queue");
        let Some(adm) = wait_for_admission(store, prefix, ticket, cfg.timeout, alive)? else { return Ok(None) };
        let rank = adm.survivors
            + adm
                .joiners
                .iter()
                .position(|(t, _)| *t == ticket)
                .ok_or_else(|| Error::internal("admission without us"))? as u32;
        let size = adm.size();
        let expected = bootstrap::Expected::now((0..rank).collect())?;
        let socks = std::thread::scope(|s| -> Result<Vec<(u32, TcpStream)>> {
            let acceptor =
                s.spawn(|| bootstrap::accept_peers(&listener, adm.id, (0..rank, &expected), size, token, cfg));
            let mut socks = connect_joiners(&adm, rank, token, cfg)?;
            socks.extend(acceptor.join().map_err(|_| Error::internal("accept thread panicked"))??);
            Ok(socks)
        })?;
        let inbox = Arc::new(Inbox::default());
        let mut links: Vec<Option<Arc<dyn Link>>> = (0..size).map(|_| None).collect();
        for (peer, sock) in socks {
            links[peer as usize] = Some(tcp::start_link(sock, peer, &inbox, cfg)?);
        }
        let pulse = crate::transport::pulse::Pulse::open(cfg.bind_addr, token);
        let net = Net::new(rank, links, inbox, pulse, Default::default(), cfg, None).shared();
        let inner = CommInner::new(
            net,
            adm.id,
            adm.epoch,
            rank,
            (0..size).collect(),
            super::Setup::of(cfg, LinkCosts::builtin()),
        );
        tracing::info!(rank, size, epoch = adm.epoch, "joined");
        Ok(Some(Communicator::world(inner, origin)))
    }

    /// Called by every survivor: agrees on the failed set, then admits the ranks waiting in the
    /// join queue (waiting up to `timeout` for a first one when none is there yet), and returns a
    /// communicator of survivors then joiners at the next epoch.
    pub fn rebuild(&self, timeout: Duration) -> Result<Communicator> {
        let c = &self.inner;
        let _span = tracing::info_span!("rebuild", rank = c.rank, epoch = c.epoch).entered();
        let _alone = c.enter()?;
        let failed = agree::agree(c).inspect_err(|e| self.note_excluded(e))?;
        let small = self.survivors_of(&failed).inspect_err(|e| self.note_excluded(e))?;
        let Some(origin) = c.origin.clone() else { return Ok(small) };
        let epoch = small.epoch();
        // The lowest survivor admits the joiners and tells the others, in band.
        let mut blob = Vec::new();
        if small.rank() == 0 {
            let store = origin.store.connect(&origin.token, origin.cfg.timeout)?;
            let adm = admit(store.as_ref(), &origin.prefix, c.id, epoch, &failed, small.size(), timeout, &origin.cfg)?;
            blob = adm.encode();
        }
        let mut len = [blob.len() as u64];
        broadcast(&small, Ptr::from_mut(len.as_mut_ptr()), 1, DataType::Uint64)?;
        blob.resize(len[0] as usize, 0);
        broadcast(&small, Ptr::from_mut(blob.as_mut_ptr()), blob.len() as u64, DataType::Uint8)?;
        let adm = Admission::decode(&blob)?;
        if adm.joiners.is_empty() {
            return Ok(small);
        }
        let cfg = &origin.cfg;
        let rank = small.rank();
        let mut members = small.inner.members.clone();
        for (peer, sock) in connect_joiners(&adm, rank, &origin.token, cfg)? {
            let net = &c.net;
            let world = net.add_peer(|w| tcp::start_link(sock, w, &net.inbox, cfg))?;
            debug_assert_eq!(members.len() as u32, peer);
            members.push(world);
        }
        tracing::info!(rank, size = adm.size(), epoch, joiners = adm.joiners.len(), "communicator rebuilt");
        let inner = CommInner::new(c.net.clone(), adm.id, epoch, rank, members, c.setup());
        Ok(Communicator::world(inner, origin))
    }
}

/// The bytes recorded for a membership decision: failed ranks, then admitted tickets.
fn decision(failed: &[u32], joiners: &[(u64, String)]) -> Vec<u8> {
    failed.iter().flat_map(|r| r.to_le_bytes()).chain(joiners.iter().flat_map(|(t, _)| t.to_le_bytes())).collect()
}

/// One decision per epoch: whoever records first wins; a group that decided differently for the
/// same epoch (a partition) learns it here instead of forking the job.
fn check_decision(store: &dyn Store, prefix: &str, epoch: u64, decision: &[u8]) -> Result<()> {
    match store.create(&epoch_key(prefix, epoch), decision)? {
        Some(other) if other != decision => Err(Error::new(
            ErrorKind::StaleEpoch,
            format!("another membership decision is already recorded for epoch {epoch}; this group is stale"),
        )),
        _ => Ok(()),
    }
}

/// Records a shrink's decision for `small`'s epoch in the world's store, or finds the same one
/// there: each survivor does it for itself (all computed the same bytes, and a broadcast on the
/// new communicator could fail on a member that died meanwhile, which its next operation will
/// tell). A different decision already recorded means this rank's group is stale. While the
/// store cannot be reached the call retries, up to the communicator's timeout.
pub(crate) fn record_decision(
    small: &Communicator,
    origin: &Origin,
    failed: &[u32],
    joiners: &[(u64, String)],
) -> Result<()> {
    let deadline = std::time::Instant::now() + origin.cfg.timeout;
    let bytes = decision(failed, joiners);
    loop {
        let outcome = origin
            .store
            .connect(&origin.token, origin.cfg.timeout)
            .and_then(|store| check_decision(store.as_ref(), &origin.prefix, small.epoch(), &bytes));
        match outcome {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::StaleEpoch => return Err(e),
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(e.context("shrink: the decision could not be recorded in the store"))
            }
            Err(e) => {
                tracing::warn!("shrink: the store is out of reach, trying again: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

fn broadcast(c: &Communicator, buf: Ptr, count: u64, dt: DataType) -> Result<()> {
    // SAFETY: callers pass buffers of `count` elements that live until this blocking call returns.
    unsafe { c.submit(Op::Broadcast { buf, count, dt, root: 0 }, None) }
}

/// The coordinator's part: picks the queued joiners, records their admission, returns it.
#[allow(clippy::too_many_arguments)]
fn admit(
    store: &dyn Store,
    prefix: &str,
    old_id: u64,
    epoch: u64,
    failed: &[u32],
    survivors: u32,
    wait: Duration,
    cfg: &crate::config::Config,
) -> Result<Admission> {
    let admitted = match store.get(&admitted_key(prefix), Duration::ZERO) {
        Ok(v) => u64::from_le_bytes(v.get(..8).and_then(|b| b.try_into().ok()).unwrap_or_default()),
        Err(e) if e.kind() == ErrorKind::Timeout => 0,
        Err(e) => return Err(e),
    };
    let mut last = store.add(&next_key(prefix), 0)? as u64;
    if last == admitted && !wait.is_zero() {
        match store.get(&addr_key(prefix, admitted + 1), wait) {
            Ok(_) => last = store.add(&next_key(prefix), 0)? as u64,
            Err(e) if e.kind() == ErrorKind::Timeout => {}
            Err(e) => return Err(e),
        }
    }
    let mut joiners = Vec::new();
    for t in admitted + 1..=last {
        // A ticket is taken just before its address is published.
        let addr = store.get(&addr_key(prefix, t), cfg.timeout)?;
        joiners.push((t, String::from_utf8_lossy(&addr).into_owned()));
    }
    let tickets: Vec<u8> = joiners.iter().flat_map(|(t, _)| t.to_le_bytes()).collect();
    let lost: Vec<u8> = failed.iter().flat_map(|r| r.to_le_bytes()).collect();
    let id = derive_id(&[&old_id.to_le_bytes(), b"rebuild", &epoch.to_le_bytes(), &lost, &tickets]);
    let adm = Admission { id, epoch, survivors, joiners };
    check_decision(store, prefix, epoch, &decision(failed, &adm.joiners))?;
    let record = adm.encode();
    for (t, _) in &adm.joiners {
        store.set(&admit_key(prefix, *t), &record)?;
    }
    store.set(&admitted_key(prefix), &last.to_le_bytes())?;
    if let Err(e) = forget_tickets(store, prefix, admitted) {
        tracing::warn!("old join tickets stay in the store: {e}");
    }
    Ok(adm)
}

/// Removes the records of tickets up to `admitted`: those ranks were admitted by an earlier
/// round, are members now and never read them again. (Epoch decisions stay: a few bytes each,
/// and they are what stops a stale partition from deciding an old epoch again.)
fn forget_tickets(store: &dyn Store, prefix: &str, admitted: u64) -> Result<()> {
    let key = format!("{prefix}/join/forgotten");
    let forgotten = match store.get(&key, Duration::ZERO) {
        Ok(v) => u64::from_le_bytes(v.get(..8).and_then(|b| b.try_into().ok()).unwrap_or_default()),
        Err(e) if e.kind() == ErrorKind::Timeout => 0,
        Err(e) => return Err(e),
    };
    for t in forgotten + 1..=admitted {
        store.remove_prefix(&format!("{prefix}/join/{t}/"))?;
    }
    store.set(&key, &admitted.max(forgotten).to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_round_trip_and_garbage() {
        let a = Admission {
            id: 7,
            epoch: 2,
            survivors: 3,
            joiners: vec![(4, "127.0.0.1:5".into()), (5, "[::1]:6".into())],
        };
        assert_eq!(Admission::decode(&a.encode()).ok(), Some(a.clone()));
        let b = a.encode();
        assert!(Admission::decode(&b[..b.len() - 1]).is_err());
        assert!(Admission::decode(&[0u8; 3]).is_err());
    }

    /// A store in memory, with clean-up, for the bookkeeping below.
    #[derive(Default)]
    struct MemStore(std::sync::Mutex<std::collections::BTreeMap<String, Vec<u8>>>);

    impl Store for MemStore {
        fn set(&self, key: &str, value: &[u8]) -> Result<()> {
            self.0.lock().map_err(|_| Error::internal("poisoned"))?.insert(key.into(), value.into());
            Ok(())
        }
        fn get(&self, key: &str, _: Duration) -> Result<Vec<u8>> {
            let map = self.0.lock().map_err(|_| Error::internal("poisoned"))?;
            map.get(key).cloned().ok_or_else(|| Error::timeout("absent"))
        }
        fn add(&self, _: &str, _: i64) -> Result<i64> {
            Err(Error::internal("unused"))
        }
        fn create(&self, _: &str, _: &[u8]) -> Result<Option<Vec<u8>>> {
            Err(Error::internal("unused"))
        }
        fn remove_prefix(&self, prefix: &str) -> Result<()> {
            self.0.lock().map_err(|_| Error::internal("poisoned"))?.retain(|k, _| !k.starts_with(prefix));
            Ok(())
        }
    }

    #[test]
    fn admitted_tickets_are_forgotten_once_and_only_they() {
        let store = MemStore::default();
        for t in 1..=5u64 {
            store.set(&addr_key("p", t), b"a").ok();
            store.set(&admit_key("p", t), b"b").ok();
        }
        let left = |store: &MemStore| -> Vec<u64> {
            (1..=5).filter(|&t| store.get(&addr_key("p", t), Duration::ZERO).is_ok()).collect()
        };
        forget_tickets(&store, "p", 0).ok();
        assert_eq!(left(&store), vec![1, 2, 3, 4, 5]);
        forget_tickets(&store, "p", 2).ok();
        assert_eq!(left(&store), vec![3, 4, 5]);
        assert!(store.get(&admit_key("p", 2), Duration::ZERO).is_err());
        // A record written again below the mark is not revisited: each round removes only its range.
        store.set(&addr_key("p", 1), b"again").ok();
        forget_tickets(&store, "p", 4).ok();
        assert_eq!(left(&store), vec![1, 5]);
    }
}
