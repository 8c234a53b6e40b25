//! Setting up shared memory with every peer over their TCP connections: host identities, the
//! segments (created by the lower rank of a pair, mapped by both, unlinked once both have it),
//! and the agreement on single-copy reads.
//!
//! All peers are handled at once, in phases: a phase writes its small message to every peer, then
//! reads every peer's. Each message fits any socket buffer, so no write waits for a read and no
//! two ranks can wait for each other in a cycle; a rank waits for its slowest peer once per phase.
//! (Pair by pair in one global order, the waits chained through all ranks: 32 local ranks on two
//! cores took 1.2 s to set up.)

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;

use super::*;

pub(super) const OFFER_MAGIC: u32 = 0x5348_4d33; // "SHM3": the hello names its rank

/// What the handshake learnt about one peer.
pub(crate) struct Learnt {
    pub host: HostId,
    /// The link, if shared memory is set up.
    pub link: Option<ShmPeer>,
    /// The peer's process when it runs on this host and this rank sees it in /proc (the same
    /// pid namespace), whatever the transport: the kernel's word on its liveness
    /// (kernel_liveness.rs).
    pub process: Option<Process>,
}

/// Offers and accepts shared memory on freshly authenticated sockets (`socks`: world rank and
/// socket per peer), before their reader starts. Returns what was learnt per peer, in `socks`'
/// order.
pub(crate) fn handshake(
    socks: &mut [(u32, TcpStream)],
    me: u32,
    mesh: u64,
    mine: &HostId,
    cfg: &Config,
) -> Result<Vec<Learnt>> {
    for (peer, sock) in socks.iter_mut() {
        sock.set_read_timeout(Some(cfg.timeout)).map_err(hs_err(*peer, "timeout"))?;
    }
    let hosts = exchange_hellos(socks, me, mine, cfg)?;
    let wanted: Vec<bool> = hosts.iter().map(|h| h.allows.is_some_and(|a| a) && h.host == *mine).collect();
    let mut links = exchange_segments(socks, &wanted, me, mesh)?;
    for (i, (peer, _)) in socks.iter().enumerate() {
        if links[i].is_none() && cfg.transport == Transport::Shm {
            return Err(Error::new(
                ErrorKind::System,
                format!("no shared memory with world rank {peer} (HCCN_TRANSPORT=shm)"),
            ));
        }
    }
    let pids = agree_cma(socks, &links, cfg.cma != Cma::Off)?;
    for (link, pid) in links.iter_mut().zip(pids) {
        if let Some(l) = link {
            l.cma_pid = pid;
            l.reads_pay = pid.is_some() && (cfg.cma == Cma::On || reads_pay());
        }
    }
    Ok(hosts.into_iter().zip(links).map(|(h, link)| Learnt { host: h.host, link, process: h.process }).collect())
}

/// A peer's hello, read.
struct Hello {
    host: HostId,
    /// Whether the peer allows shared memory, when it is on this host and this side does.
    allows: Option<bool>,
    process: Option<Process>,
}

/// Bytes of a hello: magic, host id, whether shared memory is allowed, world rank, pid and
/// process start time.
const HELLO_BYTES: usize = 53;

/// Phase 1: who each side is, host ids, processes and whether each side allows shared memory.
/// The rank each side names must be the one the other meant to reach: an address read from a
/// store may be stale (a previous run's), and its port taken since by another member. A pid
/// means the peer's process here only if its start time here matches ([`Process::verified`]).
fn exchange_hellos(socks: &mut [(u32, TcpStream)], me: u32, mine: &HostId, cfg: &Config) -> Result<Vec<Hello>> {
    let allow = cfg.transport != Transport::Tcp;
    let (pid, start) = Process::mine();
    let mut hello = [0u8; HELLO_BYTES];
    hello[0..4].copy_from_slice(&OFFER_MAGIC.to_le_bytes());
    hello[4..36].copy_from_slice(mine);
    hello[36] = allow as u8;
    hello[37..41].copy_from_slice(&me.to_le_bytes());
    hello[41..45].copy_from_slice(&pid.to_le_bytes());
    hello[45..53].copy_from_slice(&start.to_le_bytes());
    for (peer, sock) in socks.iter_mut() {
        sock.write_all(&hello).map_err(hs_err(*peer, "send"))?;
    }
    let mut hosts = Vec::with_capacity(socks.len());
    for (peer, sock) in socks.iter_mut() {
        let mut theirs = [0u8; HELLO_BYTES];
        sock.read_exact(&mut theirs).map_err(hs_err(*peer, "receive"))?;
        if theirs[0..4] != OFFER_MAGIC.to_le_bytes() {
            return Err(Error::new(ErrorKind::Connect, format!("world rank {peer} sent no shared-memory hello")));
        }
        let named = u32::from_le_bytes([theirs[37], theirs[38], theirs[39], theirs[40]]);
        if named != *peer {
            return Err(Error::new(
                ErrorKind::Connect,
                format!("the connection meant for world rank {peer} reached world rank {named} (a stale address?)"),
            ));
        }
        let mut host = [0u8; 32];
        host.copy_from_slice(&theirs[4..36]);
        if cfg.transport == Transport::Shm && host != *mine {
            return Err(Error::invalid(format!(
                "HCCN_TRANSPORT=shm, but world rank {peer} is on another host (or network namespace)"
            )));
        }
        let same_host = host == *mine;
        let pid = i32::from_le_bytes([theirs[41], theirs[42], theirs[43], theirs[44]]);
        let mut start = [0u8; 8];
        start.copy_from_slice(&theirs[45..53]);
        let process = same_host.then(|| Process::verified(pid, u64::from_le_bytes(start))).flatten();
        hosts.push(Hello { host, allows: allow.then_some(theirs[36] == 1), process });
    }
    Ok(hosts)
}

/// The names of segments this rank created, unlinked when set-up ends however it ends: by then
/// every peer that will map its segment has it mapped.
struct Unlink(Vec<String>);

impl Drop for Unlink {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Phases 2 and 3: the lower rank of each wanted pair creates the segment and sends its name (an
/// empty name when it could not); the higher maps it and answers whether it could; the lower
/// reads the answer. A pair either side could not map falls back to TCP.
fn exchange_segments(
    socks: &mut [(u32, TcpStream)],
    wanted: &[bool],
    me: u32,
    mesh: u64,
) -> Result<Vec<Option<ShmPeer>>> {
    let mut made: Vec<Option<Segment>> = (0..socks.len()).map(|_| None).collect();
    let mut created = Unlink(Vec::new());
    for (i, (peer, sock)) in socks.iter_mut().enumerate() {
        if !wanted[i] || me > *peer {
            continue;
        }
        let path = format!("/dev/shm/hccn-{mesh:016x}-{}-{me}-{peer}", std::process::id());
        made[i] = create(&path);
        created.0.push(path.clone());
        let name = if made[i].is_some() { path.as_bytes() } else { &[][..] };
        let mut msg = (name.len() as u32).to_le_bytes().to_vec();
        msg.extend_from_slice(name);
        sock.write_all(&msg).map_err(hs_err(*peer, "send name"))?;
    }
    let mut links: Vec<Option<ShmPeer>> = (0..socks.len()).map(|_| None).collect();
    for (i, (peer, sock)) in socks.iter_mut().enumerate() {
        if wanted[i] && me > *peer {
            let mapped = map_named(sock, *peer)?;
            sock.write_all(&[mapped.is_some() as u8]).map_err(hs_err(*peer, "answer"))?;
            links[i] = mapped.map(|s| ShmPeer::new(s, false));
        }
    }
    for (i, (peer, sock)) in socks.iter_mut().enumerate() {
        if wanted[i] && me < *peer {
            let mut ok = [0u8; 1];
            sock.read_exact(&mut ok).map_err(hs_err(*peer, "receive answer"))?;
            links[i] = made[i].take().filter(|_| ok[0] == 1).map(|s| ShmPeer::new(s, true));
        }
    }
    Ok(links)
}

/// A new segment at `path`, or `None` (logged) when shared memory is not to be had.
fn create(path: &str) -> Option<Segment> {
    match Segment::create(path, SEG_BYTES) {
        Ok(s) => {
            mark_cpus_unknown(&s);
            Some(s)
        }
        Err(e) => {
            super::segment::fell_back(&format!("a pair of ranks ({path})"), &e, "such pairs use TCP");
            None
        }
    }
}

/// Reads the name of the segment the lower rank `peer` created and maps it; `None` when it sent
/// no name or the segment cannot be mapped (then the pair uses TCP).
fn map_named(sock: &mut TcpStream, peer: u32) -> Result<Option<Segment>> {
    let io = |what: &'static str| hs_err(peer, what);
    let mut len = [0u8; 4];
    sock.read_exact(&mut len).map_err(io("receive name"))?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 {
        return Ok(None);
    }
    if len > 256 {
        return Err(Error::new(ErrorKind::Connect, "shared-memory name too long"));
    }
    let mut name = vec![0u8; len];
    sock.read_exact(&mut name).map_err(io("receive name"))?;
    let path = String::from_utf8_lossy(&name).into_owned();
    if !path.starts_with("/dev/shm/hccn-") || path.contains("..") {
        return Ok(None);
    }
    let mapped = OpenOptions::new().read(true).write(true).open(&path).and_then(|f| match f.metadata()?.len() {
        l if l == SEG_BYTES as u64 => Segment::map(&f, SEG_BYTES),
        l => Err(std::io::Error::other(format!("segment of {l} bytes"))),
    });
    Ok(mapped
        .map_err(|e| super::segment::fell_back(&format!("a pair of ranks ({path})"), &e, "such pairs use TCP"))
        .ok())
}

pub(super) fn hs_err(peer: u32, what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::io(ErrorKind::Connect, format!("shared-memory handshake with world rank {peer}: {what}"), &e)
}

/// Phases 4 and 5, for the pairs with a link: both sides send their pid and the address and
/// value of their [`CMA_MAGIC`], try to read the other's, and tell each other whether that
/// worked: single-copy reads are on only when both worked (pid namespaces, ptrace policy or
/// seccomp may forbid them, in one direction only). Returns per peer its pid when they are on.
pub(super) fn agree_cma(
    socks: &mut [(u32, TcpStream)],
    links: &[Option<ShmPeer>],
    allow: bool,
) -> Result<Vec<Option<i32>>> {
    let magic = cma_magic();
    let pid = std::process::id() as i32;
    let mut mine = [0u8; 21];
    mine[0] = allow as u8;
    mine[1..5].copy_from_slice(&pid.to_le_bytes());
    mine[5..13].copy_from_slice(&(magic.as_ptr() as u64).to_le_bytes());
    mine[13..21].copy_from_slice(&magic.load(Ordering::Relaxed).to_le_bytes());
    let linked = |i: usize| links[i].is_some();
    for (i, (peer, sock)) in socks.iter_mut().enumerate() {
        if linked(i) {
            sock.write_all(&mine).map_err(hs_err(*peer, "send pid"))?;
        }
    }
    let mut pids = vec![None; socks.len()];
    let mut cans = vec![false; socks.len()];
    for (i, (peer, sock)) in socks.iter_mut().enumerate() {
        if linked(i) {
            let mut theirs = [0u8; 21];
            sock.read_exact(&mut theirs).map_err(hs_err(*peer, "receive pid"))?;
            let (pid, addr, value) = cma_offer(&theirs);
            cans[i] = allow && theirs[0] == 1 && pid.is_some_and(|pid| cma_probe(pid, addr, value));
            pids[i] = pid;
            sock.write_all(&[cans[i] as u8]).map_err(hs_err(*peer, "send probe"))?;
        }
    }
    for (i, (peer, sock)) in socks.iter_mut().enumerate() {
        if linked(i) {
            let mut their_can = [0u8; 1];
            sock.read_exact(&mut their_can).map_err(hs_err(*peer, "receive probe"))?;
            let on = cans[i] && their_can[0] == 1;
            if !on && allow {
                tracing::debug!(
                    peer,
                    "no single-copy reads with world rank {peer} (HCCN_CMA, or the kernel forbids them)"
                );
            }
            pids[i] = pids[i].filter(|_| on);
        }
    }
    Ok(pids)
}

/// The pid (if it is a valid one), magic address and magic value in a peer's probe message.
pub(super) fn cma_offer(m: &[u8; 21]) -> (Option<i32>, u64, u64) {
    let pid = u32::from_le_bytes([m[1], m[2], m[3], m[4]]);
    let word =
        |i: usize| u64::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3], m[i + 4], m[i + 5], m[i + 6], m[i + 7]]);
    let pid = i32::try_from(pid).ok().filter(|p| *p > 0);
    (pid, word(5), word(13))
}

/// Marks a new segment's rings as produced by ranks that have not said where they run yet (0
/// would read as core 0).
pub(super) fn mark_cpus_unknown(seg: &Segment) {
    for base in [seg.ptr, seg.ptr.wrapping_add(RING_BYTES)] {
        Ring { base }.cpu_word().store(u32::MAX, Ordering::Relaxed);
    }
}
