//! Pulses: a small UDP datagram from each rank to each peer every `HCCN_HEARTBEAT_MS`, on a
//! path of its own. A heartbeat on the TCP connection waits behind whatever payload is queued
//! there, and after a short cut TCP's retransmission back-off keeps the connection silent for
//! longer than the cut (a 656 ms blip looked like 825 ms of silence); a datagram is never
//! queued behind a payload and never retransmitted, so the first pulse after a blip arrives
//! within one interval. A link is alive while bytes arrive on it or its pulses do.
//!
//! A pulse is authenticated with the job token (HMAC-SHA256, truncated) and carries a counter
//! that only grows, so neither a stranger nor a replay keeps a dead rank alive. Each rank
//! learns its peers' pulse addresses from a `PulseHello` frame on their connection, and knows a
//! pulse's sender by its address (ranks number each other differently once replacements join).

use crate::sync::Locked;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

const MAGIC: &[u8; 4] = b"HCPL";
const MAC: usize = 16;
/// magic, counter, MAC.
const PULSE: usize = 4 + 8 + MAC;

/// This rank's pulse socket and what it heard.
pub(crate) struct Pulse {
    sock: UdpSocket,
    token: Vec<u8>,
    start: Instant,
    sent: AtomicU64,
    /// Per world rank: the last counter accepted, and when (ms since `start`).
    heard: Mutex<Vec<(u64, u64)>>,
}

impl Pulse {
    /// A pulse socket on `ip` (any port); `None` when none can be opened (TCP heartbeats still
    /// keep links alive then).
    pub fn open(ip: IpAddr, token: &[u8]) -> Option<Pulse> {
        let sock = UdpSocket::bind(SocketAddr::new(ip, 0))
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .map_err(|e| tracing::warn!("no pulse socket on {ip} ({e}): liveness from TCP alone"))
            .ok()?;
        Some(Pulse {
            sock,
            token: token.to_vec(),
            start: Instant::now(),
            sent: AtomicU64::new(0),
            heard: Mutex::new(Vec::new()),
        })
    }

    pub fn port(&self) -> u16 {
        self.sock.local_addr().map_or(0, |a| a.port())
    }

    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn mac(&self, body: &[u8]) -> [u8; MAC] {
        let mut out = [0u8; MAC];
        if let Ok(mut m) = <Hmac<Sha256> as Mac>::new_from_slice(&self.token) {
            m.update(b"hccn-pulse");
            m.update(body);
            out.copy_from_slice(&m.finalize().into_bytes()[..MAC]);
        }
        out
    }

    /// Sends one pulse to each address (best effort: a full socket buffer skips a beat).
    pub fn send(&self, to: &[SocketAddr]) {
        let counter = self.sent.fetch_add(1, Ordering::Relaxed) + 1;
        let mut b = [0u8; PULSE];
        b[0..4].copy_from_slice(MAGIC);
        b[4..12].copy_from_slice(&counter.to_le_bytes());
        let mac = self.mac(&b[..12]);
        b[12..].copy_from_slice(&mac);
        for addr in to {
            let _ = self.sock.send_to(&b, addr);
        }
    }

    /// Takes every pulse waiting in the socket; `rank_at` names the sender by its address. A
    /// pulse from an address of no member of at most `peers`, forged or replayed is dropped.
    pub fn receive(&self, peers: usize, rank_at: &dyn Fn(SocketAddr) -> Option<u32>) {
        let mut b = [0u8; PULSE + 1];
        while let Ok((n, from)) = self.sock.recv_from(&mut b) {
            if n != PULSE || &b[0..4] != MAGIC || self.mac(&b[..12])[..] != b[12..PULSE] {
                continue;
            }
            let Some(rank) = rank_at(from).map(|r| r as usize).filter(|&r| r < peers) else { continue };
            let counter = u64::from_le_bytes([b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11]]);
            let now = self.start.elapsed().as_millis() as u64;
            let mut heard = self.heard.locked();
            if heard.len() < peers {
                heard.resize(peers, (0, 0));
            }
            if counter > heard[rank].0 {
                heard[rank] = (counter, now);
            }
        }
    }

    /// Time since the last pulse from world rank `rank`; `None` if none came yet.
    pub fn silent_for(&self, rank: u32) -> Option<Duration> {
        let heard = self.heard.locked();
        let &(counter, at) = heard.get(rank as usize)?;
        (counter > 0).then(|| self.start.elapsed().saturating_sub(Duration::from_millis(at)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulses_are_heard_only_from_members_with_the_token_and_never_replayed() {
        let ip: IpAddr = "127.0.0.1".parse().expect("ip");
        let a = Pulse::open(ip, b"token").expect("a");
        let b = Pulse::open(ip, b"token").expect("b");
        let to_a = SocketAddr::new(ip, a.port());
        let b_at = SocketAddr::new(ip, b.port());
        let rank_at = |from: SocketAddr| (from == b_at).then_some(1);
        assert!(a.silent_for(1).is_none());
        b.send(&[to_a]);
        std::thread::sleep(Duration::from_millis(50));
        a.receive(2, &rank_at);
        assert!(a.silent_for(1).is_some_and(|d| d < Duration::from_secs(1)));
        // Another job's token, a stranger's address, a replay: nothing new is heard.
        let stranger = Pulse::open(ip, b"other").expect("stranger");
        let unknown = Pulse::open(ip, b"token").expect("unknown");
        std::thread::sleep(Duration::from_millis(30));
        let before = a.heard.lock().expect("lock")[1];
        stranger.send(&[to_a]);
        unknown.send(&[to_a]);
        let mut replay = [0u8; PULSE];
        replay[0..4].copy_from_slice(MAGIC);
        replay[4..12].copy_from_slice(&1u64.to_le_bytes());
        let mac = b.mac(&replay[..12]);
        replay[12..].copy_from_slice(&mac);
        let _ = b.sock.send_to(&replay, to_a);
        std::thread::sleep(Duration::from_millis(50));
        a.receive(2, &rank_at);
        assert_eq!(a.heard.lock().expect("lock")[1], before, "nothing but a fresh member pulse counts");
    }
}
