//! Setting up shared memory with a peer over its TCP connection: host identities, the segment
//! (created by the lower rank, mapped by both, unlinked once both have it), and the agreement on
//! single-copy reads.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::Ordering;

use super::*;

pub(super) const OFFER_MAGIC: u32 = 0x5348_4d32; // "SHM2": slot headers carry fingerprints

/// Offers and accepts shared memory on a freshly authenticated socket, before its reader
/// starts. Both sides first exchange host ids and whether they allow shared memory; on one host
/// the lower rank creates the segment and names it, the higher maps it and answers, and the
/// lower unlinks it. Returns the peer's host id and the link, if shared memory was set up.
pub(crate) fn handshake(
    sock: &mut TcpStream,
    me: u32,
    peer: u32,
    mesh: u64,
    mine: &HostId,
    cfg: &Config,
) -> Result<(HostId, Option<ShmPeer>)> {
    let io = |what: &'static str| hs_err(peer, what);
    sock.set_read_timeout(Some(cfg.timeout)).map_err(io("timeout"))?;
    let allow = cfg.transport != Transport::Tcp;
    let mut hello = [0u8; 37];
    hello[0..4].copy_from_slice(&OFFER_MAGIC.to_le_bytes());
    hello[4..36].copy_from_slice(mine);
    hello[36] = allow as u8;
    sock.write_all(&hello).map_err(io("send"))?;
    let mut theirs = [0u8; 37];
    sock.read_exact(&mut theirs).map_err(io("receive"))?;
    if theirs[0..4] != OFFER_MAGIC.to_le_bytes() {
        return Err(Error::new(ErrorKind::Connect, format!("world rank {peer} sent no shared-memory hello")));
    }
    let mut their_host = [0u8; 32];
    their_host.copy_from_slice(&theirs[4..36]);
    let same = their_host == *mine;
    if cfg.transport == Transport::Shm && !same {
        return Err(Error::invalid(format!(
            "HCCN_TRANSPORT=shm, but world rank {peer} is on another host (or network namespace)"
        )));
    }
    if !(same && allow && theirs[36] == 1) {
        return Ok((their_host, None));
    }
    let mut link = if me < peer { offer(sock, me, peer, mesh)? } else { accept(sock, peer)? };
    if let Some(l) = &mut link {
        l.cma_pid = agree_cma(sock, peer, cfg.cma)?;
    }
    if link.is_none() && cfg.transport == Transport::Shm {
        return Err(Error::new(
            ErrorKind::System,
            format!("no shared memory with world rank {peer} (HCCN_TRANSPORT=shm)"),
        ));
    }
    Ok((their_host, link))
}

pub(super) fn hs_err(peer: u32, what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::io(ErrorKind::Connect, format!("shared-memory handshake with world rank {peer}: {what}"), &e)
}

/// Both sides of a shared-memory pair send their pid and the address and value of their
/// [`CMA_MAGIC`], try to read the other's, and tell each other whether that worked: single-copy
/// reads are on only when both worked (pid namespaces, ptrace policy or seccomp may forbid them,
/// in one direction only). Returns the peer's pid when they are on.
pub(super) fn agree_cma(sock: &mut TcpStream, peer: u32, allow: bool) -> Result<Option<i32>> {
    let io = |what: &'static str| hs_err(peer, what);
    let magic = cma_magic();
    let mut mine = [0u8; 21];
    mine[0] = allow as u8;
    mine[1..5].copy_from_slice(&std::process::id().to_le_bytes());
    mine[5..13].copy_from_slice(&(magic.as_ptr() as u64).to_le_bytes());
    mine[13..21].copy_from_slice(&magic.load(Ordering::Relaxed).to_le_bytes());
    // Both write before they read: 21 bytes fit any socket buffer.
    sock.write_all(&mine).map_err(io("send pid"))?;
    let mut theirs = [0u8; 21];
    sock.read_exact(&mut theirs).map_err(io("receive pid"))?;
    let (pid, addr, value) = cma_offer(&theirs);
    let can = allow && theirs[0] == 1 && pid.is_some_and(|pid| cma_probe(pid, addr, value));
    sock.write_all(&[can as u8]).map_err(io("send probe"))?;
    let mut their_can = [0u8; 1];
    sock.read_exact(&mut their_can).map_err(io("receive probe"))?;
    let on = can && their_can[0] == 1;
    if !on && allow {
        tracing::debug!(peer, "no single-copy reads with world rank {peer} (HCCN_CMA, or the kernel forbids them)");
    }
    Ok(pid.filter(|_| on))
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

pub(super) fn offer(sock: &mut TcpStream, me: u32, peer: u32, mesh: u64) -> Result<Option<ShmPeer>> {
    let io = |what: &'static str| hs_err(peer, what);
    let path = format!("/dev/shm/hccn-{mesh:016x}-{}-{me}-{peer}", std::process::id());
    let made = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|f| f.set_len(SEG_BYTES as u64).map(|_| f))
        .and_then(|f| Segment::map(&f, SEG_BYTES));
    let seg = match made {
        Ok(s) => {
            mark_cpus_unknown(&s);
            Some(s)
        }
        Err(e) => {
            tracing::warn!(peer, "no shared memory ({path}: {e}); using TCP");
            let _ = std::fs::remove_file(&path);
            None
        }
    };
    let name = if seg.is_some() { path.as_bytes() } else { &[][..] };
    let mut msg = (name.len() as u32).to_le_bytes().to_vec();
    msg.extend_from_slice(name);
    let sent = sock.write_all(&msg).map_err(io("send name"));
    let mut ok = [0u8; 1];
    let answered = sent.and_then(|_| sock.read_exact(&mut ok).map_err(io("receive answer")));
    // Both have it mapped (or never will): the name is no longer needed.
    let _ = std::fs::remove_file(&path);
    answered?;
    Ok(seg.filter(|_| ok[0] == 1).map(|s| ShmPeer::new(s, true)))
}

pub(super) fn accept(sock: &mut TcpStream, peer: u32) -> Result<Option<ShmPeer>> {
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
    let mapped = if path.starts_with("/dev/shm/hccn-") && !path.contains("..") {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .and_then(|f| match f.metadata()?.len() {
                l if l == SEG_BYTES as u64 => Segment::map(&f, SEG_BYTES),
                l => Err(std::io::Error::other(format!("segment of {l} bytes"))),
            })
            .map_err(|e| tracing::warn!("no shared memory ({path}: {e}); using TCP"))
            .ok()
    } else {
        None
    };
    sock.write_all(&[mapped.is_some() as u8]).map_err(io("answer"))?;
    Ok(mapped.map(|s| ShmPeer::new(s, false)))
}
