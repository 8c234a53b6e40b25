//! Single-copy reads (cross-memory attach): a descriptor in the ring names the sender's buffer,
//! and the receiver reads it with `process_vm_readv`, or with plain loads when it lies in
//! shareable memory the receiver has mapped (see `mem.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::*;
use crate::transport::sink::Out;

/// What a descriptor slot carries: where the payload lies in the sender's memory, the
/// descriptor's number in its direction (both sides count them, so a lost or repeated one shows),
/// and the shareable region that holds the payload, if one does (see `mem.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Desc {
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) index: u64,
    pub(super) region: Option<RegionRef>,
}

impl Desc {
    /// Encoded length, without and with a region.
    pub(super) const PLAIN: usize = 24;
    pub(super) const IN_REGION: usize = Self::PLAIN + RegionRef::WORDS * 8;

    pub(super) fn encode(&self, b: &mut [u8; Desc::IN_REGION]) -> usize {
        let words = [self.addr, self.len, self.index].into_iter().chain(self.region.iter().flat_map(|r| r.words()));
        let mut n = 0;
        for w in words {
            b[n..n + 8].copy_from_slice(&w.to_le_bytes());
            n += 8;
        }
        n
    }
    pub(super) fn decode(b: &[u8]) -> Option<Desc> {
        if b.len() != Self::PLAIN && b.len() != Self::IN_REGION {
            return None;
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let region = (b.len() == Self::IN_REGION).then(|| RegionRef::from_words(std::array::from_fn(|i| word(3 + i))));
        Some(Desc { addr: word(0), len: word(1), index: word(2), region })
    }
}

/// A value at a fixed address of this process that a peer reads at the handshake to learn
/// whether the kernel lets it read this process's memory (random per process, so that a reader
/// in another pid namespace cannot mistake a same-numbered process running the same binary).
pub(super) static CMA_MAGIC: AtomicU64 = AtomicU64::new(0);

pub(super) fn cma_magic() -> &'static AtomicU64 {
    if CMA_MAGIC.load(Ordering::Relaxed) == 0 {
        let mut v = [0u8; 8];
        let _ = getrandom::getrandom(&mut v);
        let v = u64::from_le_bytes(v) | 1;
        let _ = CMA_MAGIC.compare_exchange(0, v, Ordering::SeqCst, Ordering::SeqCst);
    }
    &CMA_MAGIC
}

/// Reads `dst.len()` bytes at `addr` in process `pid`; anything short of all of them is an error.
pub(super) fn cma_read(pid: i32, addr: u64, dst: &mut [u8]) -> std::io::Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    let local = libc::iovec { iov_base: dst.as_mut_ptr().cast(), iov_len: dst.len() };
    let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: dst.len() };
    // SAFETY: `local` covers exactly the writable `dst`; the kernel checks the remote range
    // against the other process's mappings (EFAULT), it never touches ours beyond `dst`.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    match n {
        n if n < 0 => Err(std::io::Error::last_os_error()),
        n if n as usize == dst.len() => Ok(()),
        n => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("read {n} of {} bytes", dst.len()))),
    }
}

/// A read across processes pays while it costs at most this many copies of the same bytes: it
/// replaces the sender's copy into the ring and the receiver's copy out of it.
const READ_PAYS_UP_TO_COPIES: f64 = 2.0;
/// Rounds of the measurement; each kind takes its fastest (a round that was preempted says
/// nothing of the kernel).
const MEASURE_ROUNDS: usize = 5;

/// What a `process_vm_readv` of [`CMA_PIECE`] bytes cost this process, against a copy of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadCost {
    pub read_us: f64,
    pub copy_us: f64,
    /// At most [`READ_PAYS_UP_TO_COPIES`] copies: heap chunks go by descriptor.
    pub pays: bool,
}

static READ_COST: OnceLock<ReadCost> = OnceLock::new();

/// This process's [`ReadCost`], if it measured one (under `HCCN_CMA=auto`, once a shared-memory
/// link agreed on single-copy reads).
pub fn read_cost() -> Option<ReadCost> {
    READ_COST.get().copied()
}

/// Whether a `process_vm_readv` costs this host at most [`READ_PAYS_UP_TO_COPIES`] copies of the
/// same bytes ([`CMA_PIECE`], the piece a receiver reads at once). Measured once per process,
/// on its own memory (the kernel pins and copies the pages as it does a peer's): about 0.2 ms.
/// On the 2-core development VM a read took 31 us where a copy took 7.5 (8.5 against 30 GB/s
/// from 256 KiB to 4 MiB), so reads do not pay there.
pub(super) fn reads_pay() -> bool {
    READ_COST.get_or_init(measure_reads).pays
}

fn measure_reads() -> ReadCost {
    let src = vec![1u8; CMA_PIECE];
    let mut dst = vec![2u8; CMA_PIECE];
    let (mut copy, mut read) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..MEASURE_ROUNDS {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        copy = copy.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        if let Err(e) = cma_read(std::process::id() as i32, src.as_ptr() as u64, &mut dst) {
            tracing::debug!("process_vm_readv of this process's own memory failed ({e}): no reads");
            return ReadCost { read_us: f64::INFINITY, copy_us: copy * 1e6, pays: false };
        }
        read = read.min(t.elapsed().as_secs_f64());
    }
    let cost = ReadCost { read_us: read * 1e6, copy_us: copy * 1e6, pays: read <= READ_PAYS_UP_TO_COPIES * copy };
    tracing::info!(
        target: "hccn_runtime::transport",
        read_us = %format_args!("{:.1}", cost.read_us),
        copy_us = %format_args!("{:.1}", cost.copy_us),
        pays = cost.pays,
        "single-copy reads of {} KiB measured against a copy (HCCN_CMA=on reads whatever they cost)",
        CMA_PIECE >> 10
    );
    cost
}

/// True when this process may read `pid`'s memory and finds `expect` at `addr`.
pub(super) fn cma_probe(pid: i32, addr: u64, expect: u64) -> bool {
    let mut v = [0u8; 8];
    match cma_read(pid, addr, &mut v) {
        Ok(()) => u64::from_le_bytes(v) == expect,
        Err(e) => {
            tracing::debug!(pid, "process_vm_readv not permitted ({e}); shared-memory rings only");
            false
        }
    }
}

/// The error for a failed read of `src`'s memory: its death (the process is gone) or a transfer
/// error (a bad address or a short read: the pair is out of step).
pub(super) fn cma_error(src: u32, e: &std::io::Error, inbox: &Inbox) -> Error {
    if e.raw_os_error() == Some(libc::ESRCH) {
        let reason = "its process ended while this rank read its data".to_owned();
        inbox.mark_failed(src, crate::transport::Fault::sure(reason.clone()));
        return Error::rank_failed(vec![src], format!("world rank {src} failed: {reason}"));
    }
    Error::io(ErrorKind::Transfer, format!("reading the data of world rank {src} (process_vm_readv)"), e)
}

pub(super) fn out_of_step() -> Error {
    Error::new(ErrorKind::Transfer, "shared memory ring out of step")
}

/// Reads descriptor `d`'s payload from `src`'s memory straight into `out`'s buffer, or in pieces
/// to `out`'s function, then acknowledges it, whatever the outcome: with plain loads when it lies
/// in a region of shareable memory this process has mapped, else with `process_vm_readv`
/// (through the scratch buffer for a function). False when the sender had withdrawn it (nothing
/// was read).
pub(super) fn cma_take(
    p: &ShmPeer,
    st: &mut RxState,
    src: u32,
    d: Desc,
    inbox: &Inbox,
    out: &mut Out<'_>,
) -> Result<bool> {
    let Some(pid) = p.cma_pid else { return Err(Error::internal("no single-copy path")) };
    let ring = &p.rx;
    let (posted, reading) = (d.index << 2 | POSTED, d.index << 2 | READING);
    match ring.cma_state(d.index).compare_exchange(posted, reading, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => {}
        Err(s) => {
            ring.acknowledge(d.index);
            return if s == d.index << 2 | WITHDRAWN { Ok(false) } else { Err(out_of_step()) };
        }
    }
    let total = d.len as usize;
    let r = match d.region {
        Some(region) => match st.maps.view(pid, &region, d.addr, total) {
            Ok(Some(mapped)) => take_mapped(mapped, out),
            Ok(None) => take_cma(pid, d.addr, total, &mut st.scratch, out),
            Err(e) => {
                ring.acknowledge(d.index);
                return Err(e.context(format!("world rank {src}")));
            }
        },
        None => take_cma(pid, d.addr, total, &mut st.scratch, out),
    };
    ring.acknowledge(d.index);
    r.map(|_| true).map_err(|e| cma_error(src, &e, inbox))
}

/// Hands a payload mapped into this process to `out`, piece by piece where a piece is then read
/// again (so that it is still in cache).
pub(super) fn take_mapped(src: &[u8], out: &mut Out<'_>) -> std::io::Result<()> {
    let short = || std::io::Error::other("a frame longer than its buffer");
    match out {
        Out::Into(buf) => buf.get_mut(..src.len()).ok_or_else(short)?.copy_from_slice(src),
        Out::IntoThen(buf, then) => {
            let dst = buf.get_mut(..src.len()).ok_or_else(short)?;
            for (i, (d, s)) in dst.chunks_mut(CMA_PIECE).zip(src.chunks(CMA_PIECE)).enumerate() {
                then(d, Some(s), i * CMA_PIECE);
            }
        }
        Out::Pieces(piece) => {
            for (i, s) in src.chunks(CMA_PIECE).enumerate() {
                piece(i * CMA_PIECE, s);
            }
        }
    }
    Ok(())
}

/// Reads `total` bytes at `addr` in process `pid` into `out` with `process_vm_readv`.
pub(super) fn take_cma(
    pid: i32,
    addr: u64,
    total: usize,
    scratch: &mut Vec<u8>,
    out: &mut Out<'_>,
) -> std::io::Result<()> {
    match out {
        Out::Into(buf) => match buf.get_mut(..total) {
            Some(dst) => cma_read(pid, addr, dst),
            None => Err(std::io::Error::other("a frame longer than its buffer")),
        },
        // Piece by piece, so that each is still in cache when `then` reads it.
        Out::IntoThen(buf, then) => match buf.get_mut(..total) {
            Some(dst) => {
                for (i, piece) in dst.chunks_mut(CMA_PIECE).enumerate() {
                    cma_read(pid, addr + (i * CMA_PIECE) as u64, piece)?;
                    then(piece, None, i * CMA_PIECE);
                }
                Ok(())
            }
            None => Err(std::io::Error::other("a frame longer than its buffer")),
        },
        Out::Pieces(piece) => {
            if scratch.is_empty() {
                *scratch = vec![0u8; CMA_PIECE];
            }
            let mut off = 0;
            while off < total {
                let n = (total - off).min(CMA_PIECE);
                cma_read(pid, addr + off as u64, &mut scratch[..n])?;
                piece(off, &scratch[..n]);
                off += n;
            }
            Ok(())
        }
    }
}
