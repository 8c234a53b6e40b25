//! The cost model's link figures, agreed once per world as it forms. Sender and receiver must
//! choose the same algorithm and chunks, so every rank must hold the same figures: world rank 0
//! alone decides (it measures, or takes `HCCN_LINK_COST`) and sends them to every rank.
//!
//! Measuring: against one peer per transport kind it has (a shared-memory peer, and a TCP peer on
//! another host, or on its own host under `HCCN_TRANSPORT=tcp`), rank 0 times [`PINGS`] round
//! trips of 8 bytes (α is half the median) and [`BULKS`] of 1 MiB (β from the fastest, less α);
//! the peer echoes. A process measures each kind once: later worlds reuse its figures. Frames
//! travel as collective frames (so that they take the data path being measured) of a
//! communicator id of their own, which no user communicator has. In a world that connects on
//! demand the figures go down the binomial tree of rank 0 (links the world forms with), and
//! rank 0 measures only against its children there.

use crate::sync::Locked;
use std::sync::Mutex;
use std::time::Instant;

use crate::config::{Config, LinkCostSource};
use crate::error::{Error, ErrorKind, Result};
use crate::transport::shm::{Out, Sink};
use crate::transport::{Health, Key, Net};
use crate::tuning::{LinkCost, LinkCosts, TransportKind};
use crate::tuning::{LINK_ALPHA_US, LINK_GBPS};
use crate::wire::{FrameHeader, FrameKind};

/// Round trips of 8 bytes for α, after [`WARMUP`] untimed ones.
const PINGS: usize = 20;
const WARMUP: usize = 2;
const PING_BYTES: usize = 8;
/// Where the host has a core per rank, a shared-memory α above this (µs) means the two
/// processes ran on one core for the while (each ping waited out the other's spin): freshly
/// started processes sometimes do, until the scheduler spreads them. 1 world in 12 measured
/// 14-18 µs on the 2-core machine (0.6-0.9 µs otherwise; 1.9-2.8 with 4 ranks on its 2 cores),
/// and its plans took recursive doubling at 256 KiB, 4x slower than the ring.
const CROWDED_SHM_ALPHA_US: f64 = 5.0;
/// Series of pings for such a link, a few ms apart, before it keeps the built-in figures.
const CROWDED_RETRIES: usize = 3;
/// Ranks per core on rank 0's host beyond which it does not measure but takes the built-in
/// figures (64 ranks on the 2-core machine still measure).
const TOO_CROWDED_TO_MEASURE: usize = 32;
/// Round trips of [`BULK_BYTES`] for β.
const BULKS: usize = 3;
const BULK_BYTES: usize = 1 << 20;

/// Frame tags: rank 0's pings (echoed back with the same tag), then its figures.
const TAG_PING: u32 = 1;
const TAG_FIGURES: u32 = 2;
/// α and β of each kind, then whether rank 0's host runs more ranks than it has cores.
const FIGURES_BYTES: usize = 56;

/// What this process measured so far: kind, whether the peer was on another host, figures.
static MEASURED: Mutex<Vec<(TransportKind, bool, LinkCost)>> = Mutex::new(Vec::new());

/// Run by every rank of a new world of `size` (mesh `mesh`) once its links are up: returns the
/// figures of world rank 0, identical everywhere.
pub(crate) fn agree(net: &Net, size: u32, mesh: u64, cfg: &Config) -> Result<LinkCosts> {
    let probe = Probe { net, id: crate::comm::derive_id(&[&mesh.to_le_bytes(), b"link costs"]), cfg };
    let agreed = if net.rank == 0 { probe.decide(size) } else { probe.serve(size) };
    agreed.map_err(|e| e.context("agreeing on link costs"))
}

struct Probe<'a> {
    net: &'a Net,
    /// Communicator id of the probe's frames.
    id: u64,
    cfg: &'a Config,
}

impl Probe<'_> {
    /// Rank 0: the figures, from HCCN_LINK_COST or measured, sent to every other rank.
    fn decide(&self, size: u32) -> Result<LinkCosts> {
        let started = Instant::now();
        let crowding = self.host_crowding(size);
        let (mut costs, source) = match self.cfg.link_cost {
            LinkCostSource::Builtin => (LinkCosts::builtin(), "built-in"),
            LinkCostSource::Explicit(c) => (c, "HCCN_LINK_COST"),
            // Pings to a peer that waits its turn for a core time the scheduler, not the link,
            // and took longer than the others' timeout (1,024 ranks on 2 cores).
            LinkCostSource::Measure if crowding > TOO_CROWDED_TO_MEASURE => {
                (LinkCosts::builtin(), "built-in (too many ranks per core to measure)")
            }
            LinkCostSource::Measure => (self.measure_all(size, crowding)?, "measured"),
        };
        costs.shared_cores = crowding > 1;
        let figures = encode(&costs);
        for peer in self.children(0, size) {
            self.send(peer, TAG_FIGURES, &figures)?;
        }
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let shared_cores = costs.shared_cores;
        tracing::info!(rank = 0u32, %costs, shared_cores, source, took_ms = format_args!("{ms:.1}"), "link costs agreed");
        Ok(costs)
    }

    /// Rank 0: how many of the world's ranks its host runs per core it has, rounded up (more
    /// than 1: they share cores).
    fn host_crowding(&self, size: u32) -> usize {
        let hosts = &self.net.hosts;
        let here = hosts.first().copied().flatten();
        let local = (0..size as usize).filter(|&r| here.is_some() && hosts.get(r).copied().flatten() == here).count();
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        local.div_ceil(cores)
    }

    /// Rank 0: the built-in figures, with those of the kinds it reaches replaced by measured ones.
    fn measure_all(&self, size: u32, crowding: usize) -> Result<LinkCosts> {
        let mut costs = LinkCosts::builtin();
        for (kind, peer) in self.peers(size) {
            let remote = self.net.hosts.get(peer as usize) != self.net.hosts.first();
            let known = lock().iter().find(|(k, r, _)| *k == kind && *r == remote).map(|(_, _, c)| *c);
            let cost = match known {
                Some(c) => c,
                None => {
                    let c = sane(kind, self.measure_undisturbed(kind, peer, crowding <= 1)?);
                    lock().push((kind, remote, c));
                    c
                }
            };
            costs.set(kind, cost);
        }
        Ok(costs)
    }

    /// The peer to time for each kind rank 0 has: the first with shared memory; for TCP the
    /// first on another host, else (HCCN_TRANSPORT=tcp) the first on this one.
    fn peers(&self, size: u32) -> Vec<(TransportKind, u32)> {
        let net = self.net;
        let me = net.hosts.first().copied().flatten();
        // In a tree, only rank 0's children: their pings and their figures come on one link.
        let children = self.children(0, size);
        let tcp_peers = || children.iter().copied().filter(|p| !net.shm.has(*p));
        let remote = tcp_peers().find(|p| net.hosts.get(*p as usize).copied().flatten() != me);
        let tcp = remote.or_else(|| tcp_peers().find(|_| self.cfg.transport == crate::config::Transport::Tcp));
        let shm = children.iter().copied().find(|p| net.shm.has(*p));
        [(TransportKind::Shm, shm), (TransportKind::Tcp, tcp)].into_iter().filter_map(|(k, p)| Some((k, p?))).collect()
    }

    /// [`Self::measure`], once more when the bulk round trip came back faster than the pings
    /// (β < 0: the pings were held up by something else on the host, not by the link).
    fn measure_undisturbed(&self, kind: TransportKind, peer: u32, crowded_check: bool) -> Result<LinkCost> {
        let first = self.measure(kind, peer, crowded_check)?;
        if first.beta > 0.0 {
            return Ok(first);
        }
        tracing::debug!(
            peer,
            alpha_us = first.alpha_us(),
            "link measurement disturbed (bulk faster than pings): again"
        );
        self.measure(kind, peer, crowded_check)
    }

    /// α and β of the link of `kind` to `peer`, which echoes every ping; `crowded_check`: a
    /// slow shared-memory link can only be a passing crowding (see [`CROWDED_SHM_ALPHA_US`]).
    fn measure(&self, kind: TransportKind, peer: u32, crowded_check: bool) -> Result<LinkCost> {
        let crowded_check = crowded_check && kind == TransportKind::Shm;
        let small = [0u8; PING_BYTES];
        let mut alpha = f64::INFINITY;
        for attempt in 0..CROWDED_RETRIES {
            if attempt > 0 {
                // Give the scheduler a moment to move one of the two to another core.
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            for _ in 0..WARMUP {
                self.round_trip(peer, &small)?;
            }
            let mut rtts = (0..PINGS).map(|_| self.round_trip(peer, &small)).collect::<Result<Vec<f64>>>()?;
            rtts.sort_by(f64::total_cmp);
            alpha = alpha.min(rtts[rtts.len() / 2] / 2.0);
            if !crowded_check || alpha * 1e6 < CROWDED_SHM_ALPHA_US {
                break;
            }
            tracing::debug!(
                peer,
                alpha_us = alpha * 1e6,
                attempt,
                "shared-memory pings as slow as a waiter's spin: the two share a core for now"
            );
        }
        if crowded_check && alpha * 1e6 >= CROWDED_SHM_ALPHA_US {
            tracing::info!(
                peer,
                "shared-memory latency {:.3} us after {CROWDED_RETRIES} series of pings (a core shared for now): \
                 using the built-in figures",
                alpha * 1e6
            );
            return Ok(kind.default_cost());
        }
        let big = vec![0u8; BULK_BYTES];
        let mut best = f64::INFINITY;
        for _ in 0..BULKS {
            best = best.min(self.round_trip(peer, &big)?);
        }
        let beta = (best / 2.0 - alpha) / BULK_BYTES as f64;
        Ok(LinkCost { alpha, beta })
    }

    /// Seconds for `data` to reach `peer` and come back.
    fn round_trip(&self, peer: u32, data: &[u8]) -> Result<f64> {
        let t = Instant::now();
        self.send(peer, TAG_PING, data)?;
        let (tag, len) = self.recv(peer, &mut |_, _| {})?;
        if tag != TAG_PING || len != data.len() {
            return Err(Error::new(
                ErrorKind::Transfer,
                format!("world rank {peer} echoed tag {tag} with {len} bytes"),
            ));
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// Any rank but 0: echoes rank 0's pings until the figures arrive from its parent (rank 0
    /// itself but in a world that connects on demand), and passes them on to its children.
    fn serve(&self, size: u32) -> Result<LinkCosts> {
        let me = self.net.rank;
        let parent = match self.tree() {
            true => me & !(1 << (31 - me.leading_zeros())),
            false => 0,
        };
        let mut data = Vec::with_capacity(PING_BYTES);
        loop {
            data.clear();
            let (tag, _) = self.recv(parent, &mut |_, piece| data.extend_from_slice(piece))?;
            match tag {
                TAG_PING => self.send(parent, TAG_PING, &data)?,
                _ => {
                    let costs = decode(&data)?;
                    for child in self.children(me, size) {
                        self.send(child, TAG_FIGURES, &data)?;
                    }
                    tracing::debug!(rank = me, %costs, "link costs agreed");
                    return Ok(costs);
                }
            }
        }
    }

    /// Whether the figures go down a binomial tree (a world that connects on demand).
    fn tree(&self) -> bool {
        self.net.on_demand().is_some()
    }

    /// The ranks `me` sends the figures to: every other rank from rank 0, or in a tree
    /// `me + 2^i` for every `2^i` above `me`'s highest bit.
    fn children(&self, me: u32, size: u32) -> Vec<u32> {
        match (self.tree(), me) {
            (false, 0) => (1..size).collect(),
            (false, _) => Vec::new(),
            (true, _) => {
                let low = if me == 0 { 0 } else { 32 - me.leading_zeros() };
                (low..32).map(|i| me + (1 << i)).take_while(|&c| c < size).collect()
            }
        }
    }

    fn send(&self, to: u32, tag: u32, data: &[u8]) -> Result<()> {
        let hdr = FrameHeader { tag, ..FrameHeader::control(FrameKind::Collective, self.id, 0, 0, data.len()) };
        self.net.send(to, &hdr, data)
    }

    /// The next probe frame from `from`, its payload handed to `piece`: (tag, length).
    fn recv(&self, from: u32, piece: &mut dyn FnMut(usize, &[u8])) -> Result<(u32, usize)> {
        let key = Key { src: from, kind: FrameKind::Collective, comm_id: self.id, seq: 0 };
        let mut got = (0, 0);
        let mut check = |h: &FrameHeader| -> Result<()> {
            got = (h.tag, h.len as usize);
            match (h.tag, h.len as usize) {
                (TAG_PING, n) if n <= BULK_BYTES => Ok(()),
                (TAG_FIGURES, FIGURES_BYTES) => Ok(()),
                (tag, n) => Err(Error::new(
                    ErrorKind::Transfer,
                    format!("world rank {from} sent tag {tag} with {n} bytes while link costs were agreed"),
                )),
            }
        };
        let status = |h: &Health<'_>| {
            h.failed
                .get(&from)
                .map(|f| Error::rank_failed(vec![from], format!("world rank {from} failed: {}", f.reason)))
        };
        self.net.recv(
            key,
            self.cfg.timeout,
            &status,
            &mut Sink { check: &mut check, out: Out::Pieces(piece), expect: BULK_BYTES },
        )?;
        Ok(got)
    }
}

fn lock() -> std::sync::MutexGuard<'static, Vec<(TransportKind, bool, LinkCost)>> {
    MEASURED.locked()
}

/// `measured`, or the built-in figures of `kind` if it is out of range (a disturbed run).
fn sane(kind: TransportKind, measured: LinkCost) -> LinkCost {
    let (alpha_us, gbps) = (measured.alpha_us(), measured.gbps());
    if LINK_ALPHA_US.contains(&alpha_us) && LINK_GBPS.contains(&gbps) {
        return measured;
    }
    let builtin = kind.default_cost();
    // A busy host disturbs the few milliseconds of measuring (a bandwidth fit can even come out
    // negative): normal on a loaded machine, and handled, so not a warning.
    tracing::info!(
        kind = kind.name(),
        "the link measurement was disturbed (latency {alpha_us:.3} us, bandwidth {gbps:.3} GB/s, outside \
         {:?} us, {:?} GB/s); using the built-in {:.3} us, {:.3} GB/s",
        LINK_ALPHA_US,
        LINK_GBPS,
        builtin.alpha_us(),
        builtin.gbps()
    );
    builtin
}

fn encode(c: &LinkCosts) -> Vec<u8> {
    let flag = if c.shared_cores { 1.0 } else { 0.0 };
    let figures = TransportKind::ALL.iter().flat_map(|k| [c.get(*k).alpha, c.get(*k).beta]);
    figures.chain([flag]).flat_map(f64::to_le_bytes).collect()
}

fn decode(b: &[u8]) -> Result<LinkCosts> {
    let bad = || Error::new(ErrorKind::Transfer, "world rank 0 sent malformed link costs");
    let mut x = b.chunks_exact(8).map(|w| f64::from_le_bytes(w.try_into().unwrap_or_default()));
    let mut costs = LinkCosts::builtin();
    for kind in TransportKind::ALL {
        let (alpha, beta) = (x.next().ok_or_else(bad)?, x.next().ok_or_else(bad)?);
        if !(alpha.is_finite() && beta.is_finite() && alpha >= 0.0 && beta > 0.0) {
            return Err(bad());
        }
        costs.set(kind, LinkCost { alpha, beta });
    }
    costs.shared_cores = match x.next().map(f64::to_bits) {
        Some(b) if b == 1.0f64.to_bits() => true,
        Some(0) => false,
        _ => return Err(bad()),
    };
    Ok(costs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_cross_the_wire_bit_for_bit() {
        let mut c = LinkCosts::builtin();
        c.set(TransportKind::Shm, LinkCost { alpha: 1.234_567e-6, beta: 1.0 / 9.87e9 });
        let b = encode(&c);
        assert_eq!(b.len(), FIGURES_BYTES);
        assert_eq!(decode(&b).ok(), Some(c));
        assert!(decode(&b[..40]).is_err());
        let mut nan = b.clone();
        nan[8..16].copy_from_slice(&f64::NAN.to_le_bytes());
        assert!(decode(&nan).is_err());
        c.shared_cores = true;
        assert_eq!(decode(&encode(&c)).ok(), Some(c));
        let mut flag = encode(&c);
        flag[48..56].copy_from_slice(&0.5f64.to_le_bytes());
        assert!(decode(&flag).is_err());
    }

    #[test]
    fn out_of_range_measurements_fall_back_to_the_built_in_figures() {
        let ok = LinkCost::new(3.0, 5.0);
        assert_eq!(sane(TransportKind::Shm, ok), ok);
        let builtin = TransportKind::Tcp.default_cost();
        assert_eq!(sane(TransportKind::Tcp, LinkCost::new(50_000.0, 1.0)), builtin, "α of 50 ms");
        assert_eq!(sane(TransportKind::Tcp, LinkCost { alpha: 1e-5, beta: -1e-9 }), builtin, "negative β");
        assert_eq!(sane(TransportKind::Tcp, LinkCost::new(10.0, 1e4)), builtin, "10 TB/s");
    }
}
