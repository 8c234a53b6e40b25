//! What an algorithm sees while it runs: its rank and size, and matched, checked sends and
//! receives to communicator ranks. Every receive is bounded by the communicator's timeout and
//! ends early when the communicator fails, is aborted or revoked.

use std::borrow::Cow;
use std::ops::Range;

use smallvec::SmallVec;

use super::team::Team;
use crate::error::{Error, ErrorKind, Result};
use crate::reduce;
use crate::trace;
use crate::transport::shm::{Out, Sink, WritePiece};
use crate::transport::Flow;
use crate::transport::Key;
use crate::types::{DataType, ReduceOp};
use crate::wire::{Fingerprint, FrameHeader, FrameKind};

/// The fingerprint of frames outside any call.
static NO_CALL: Fingerprint = Fingerprint { op: 0, dtype: 0, redop: 0, root: 0, count: 0 };

#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    comm: &'a Team,
    kind: FrameKind,
    seq: u64,
    /// Pipeline chunk of this operation (the cost model's choice, at most HCCN_CHUNK_BYTES).
    chunk: usize,
    /// The operation's turn on the communicator's board, if it goes there (see board.rs).
    turn: Option<u64>,
    /// What every rank's call must agree on (see fingerprint.rs).
    fp: &'a Fingerprint,
}

impl<'a> Ctx<'a> {
    /// The call's sequence number on its communicator (its collectives, or one pair's p2p).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub fn new(comm: &'a Team, kind: FrameKind, seq: u64) -> Self {
        Ctx { comm, kind, seq, chunk: comm.chunk_bytes, turn: None, fp: &NO_CALL }
    }

    /// The same context for a call with fingerprint `fp`.
    pub fn with_fingerprint(self, fp: &'a Fingerprint) -> Ctx<'a> {
        Ctx { fp, ..self }
    }

    /// The same context for an operation with board turn `turn`.
    pub fn with_turn(self, turn: Option<u64>) -> Ctx<'a> {
        Ctx { turn, ..self }
    }

    /// The same context for an operation that does not go to the board after all.
    pub fn without_turn(&self) -> Ctx<'a> {
        Ctx { turn: None, ..*self }
    }

    pub fn turn(&self) -> Option<u64> {
        self.turn
    }

    pub fn board_cell(&self) -> &'a super::board::BoardCell {
        &self.comm.board
    }

    pub fn net(&self) -> &'a crate::transport::Net {
        &self.comm.net
    }

    /// The deadline of every wait (HCCN_TIMEOUT_MS).
    pub fn timeout(&self) -> std::time::Duration {
        self.comm.timeout
    }

    /// Why this communicator can make no progress (a member failed or left, a revoke, an
    /// abort), if it cannot; one atomic load while all is well. For waits outside `recv`.
    pub fn health_error(&self) -> Option<Error> {
        let inbox = &self.comm.net.inbox;
        if inbox.health_changes() == 0 {
            return None;
        }
        inbox.health(|h| self.status(h))
    }

    /// The error of a wait for the ranks `waited` says, when one of them left (it will never
    /// send what is waited for); one atomic load while all is well.
    pub fn departed_among(&self, waited: &dyn Fn(u32) -> bool) -> Option<Error> {
        let inbox = &self.comm.net.inbox;
        if inbox.health_changes() == 0 {
            return None;
        }
        inbox.health(|h| {
            self.comm.members.iter().enumerate().find_map(|(r, w)| {
                let news = h.departed.get(w).filter(|_| waited(r as u32))?;
                Some(self.comm.departed(r as u32, news))
            })
        })
    }

    /// A frame of this very operation that some member sent as a message, while this rank waits
    /// on the board (an operation goes to the board or to messages by what every rank passed
    /// alike, so such a frame is a call that differs): the mismatch, with the communicator
    /// broken, since the two sides now number their board turns differently.
    pub fn message_for_board_turn(&self) -> Option<Error> {
        let (src, hdr) = self.comm.net.inbox.any_frame(self.kind, self.comm.id, self.seq)?;
        let from = self.comm.members.iter().position(|&w| w == src)? as u32;
        Some(self.mismatch_with(from, &hdr.fp))
    }

    /// The error of this call against rank `from`'s call `theirs` of the same operation: the
    /// communicator is broken too when one of them went to the board and the other to messages
    /// (the two sides number their board turns differently from then on).
    fn mismatch_with(&self, from: u32, theirs: &Fingerprint) -> Error {
        let e = super::fingerprint::mismatch(self.fp, self.rank(), theirs, from);
        let board = &self.comm.board;
        match board.goes(self.fp) == board.goes(theirs) {
            true => e,
            false => e.context(format!(
                "{}: one rank ran the call on shared memory, another with messages",
                super::team::BROKEN_MARK
            )),
        }
    }

    /// A frame of this very operation from any member that shows a different call, waiting in
    /// the inbox: found while this rank waits for another member, so that ranks whose calls
    /// differ in whom they wait for do not wait for each other until their deadlines.
    fn foreign(&self, h: &crate::transport::Health<'_>) -> Option<Error> {
        if self.kind != FrameKind::Collective || h.queues.is_empty() {
            return None;
        }
        let (src, fp) = h.queues.iter().find_map(|(k, q)| {
            let f = q.front().filter(|_| k.kind == self.kind && k.comm_id == self.comm.id && k.seq == self.seq)?;
            (f.hdr.fp != *self.fp).then_some((k.src, f.hdr.fp))
        })?;
        let from = self.comm.members.iter().position(|&w| w == src)? as u32;
        Some(self.mismatch_with(from, &fp))
    }

    /// Why this operation's waits end, if they do: the communicator's state, or another rank
    /// abandoned this very operation (see [`CommInner::op_status`]).
    fn status(&self, health: &crate::transport::Health<'_>) -> Option<Error> {
        self.comm.op_status(health, self.kind, self.seq).or_else(|| self.foreign(health))
    }

    /// The same context with pipeline chunks of at most `bytes` (never above HCCN_CHUNK_BYTES).
    pub fn with_chunk(&self, bytes: usize) -> Ctx<'a> {
        Ctx { chunk: bytes.min(self.comm.chunk_bytes), ..*self }
    }

    /// The largest pipeline chunk (HCCN_CHUNK_BYTES).
    pub fn max_chunk(&self) -> usize {
        self.comm.chunk_bytes
    }

    /// The algorithm HCCN_ALGO forces, or `Auto`.
    pub fn forced_algo(&self) -> crate::tuning::AlgoChoice {
        self.comm.tuning.algo
    }

    /// How ranks of one host reach each other (HCCN_TRANSPORT, the same in every process of a
    /// job), for the cost model.
    pub fn intra_kind(&self) -> crate::tuning::TransportKind {
        self.comm.tuning.intra
    }

    /// The link figures the world agreed on at creation (see `comm::linkcost`).
    pub fn link_costs(&self) -> crate::tuning::LinkCosts {
        self.comm.tuning.costs
    }

    /// A `tracing` span for the operation this context runs (HCCN_LOG=hccn_runtime=debug).
    pub fn span(&self, algorithm: &str) -> tracing::Span {
        tracing::debug_span!(
            "op",
            comm = %format_args!("{:016x}", self.comm.id),
            epoch = self.comm.epoch,
            rank = self.comm.rank,
            seq = self.seq,
            kind = ?self.kind,
            algorithm,
        )
    }

    pub fn rank(&self) -> u32 {
        self.comm.rank
    }

    pub fn size(&self) -> u32 {
        self.comm.members.len() as u32
    }

    /// The communicator's id and epoch, for trace events.
    pub fn comm_id(&self) -> (u64, u64) {
        (self.comm.id, self.comm.epoch)
    }

    /// This process's world rank (names its trace file).
    pub fn world_rank(&self) -> u32 {
        self.comm.members.get(self.comm.rank as usize).copied().unwrap_or(self.comm.rank)
    }

    /// Pipeline chunk in bytes, a multiple of 8 so that chunks never split an element of any
    /// data type (HCCN_CHUNK_BYTES may be any number in its range).
    pub fn chunk(&self) -> usize {
        (self.chunk & !7).max(8)
    }

    /// Splits `len` bytes into pipeline chunks (none for 0).
    pub fn chunks(&self, len: usize) -> impl Iterator<Item = Range<usize>> {
        let c = self.chunk();
        (0..len.div_ceil(c)).map(move |i| i * c..((i + 1) * c).min(len))
    }

    /// Number of pipeline chunks of `len` bytes.
    pub fn nchunks(&self, len: usize) -> usize {
        len.div_ceil(self.chunk())
    }

    pub fn chunk_range(&self, len: usize, i: usize) -> Range<usize> {
        let c = self.chunk();
        i * c..((i + 1) * c).min(len)
    }

    fn world(&self, rank: u32) -> Result<u32> {
        self.comm
            .members
            .get(rank as usize)
            .copied()
            .ok_or_else(|| Error::internal(format!("rank {rank} outside a communicator of {}", self.size())))
    }

    /// Starts sending `data` to `to`; the send completes when [`Ctx::wait_sends`] returns. A large
    /// chunk to a same-host peer may be read by the peer straight from `data` (which is why the
    /// borrow lasts until then; see `Shm::single_copy`); anything else is sent before this returns.
    pub fn send_start<'d>(
        &self,
        sends: &mut Sends<'d>,
        (to, tag): (u32, u32),
        data: Cow<'d, [u8]>,
        flow: Flow,
    ) -> Result<()>
    where
        'a: 'd,
    {
        let t = trace::start();
        let dst = self.world(to)?;
        let hdr = self.header(tag, data.len());
        let index = self.comm.net.send_start(dst, &hdr, &data, flow).map_err(|e| self.comm.translate(e))?;
        if t.is_on() {
            trace::transfer(t, self.world_rank(), to, dst, data.len() as u64, true);
        }
        if let Some(index) = index {
            // Made first, so that a failed wait below withdraws this send too (its drop).
            let started = Pending { comm: self.comm, dst, index: Some(index), _data: data };
            if sends.pending.len() == sends.pending.inline_size() {
                self.wait_oldest(sends)?;
            }
            sends.pending.push(started);
        }
        Ok(())
    }

    /// Waits for the oldest send in `sends` and lets go of it, so that `Sends` never outgrows
    /// its inline room (no allocation however many chunks a step sends). It cannot close a
    /// cycle: every algorithm sends and receives a step's chunks in order, so before its reader
    /// takes the oldest chunk it needs only earlier chunks and steps, none of which waits for a
    /// later send of this rank.
    fn wait_oldest(&self, sends: &mut Sends<'_>) -> Result<()> {
        let mut oldest = sends.pending.remove(0);
        match oldest.index.take() {
            // Done, or withdrawn by the wait on its way out: nothing is left to withdraw.
            Some(index) => self.comm.net.send_wait(oldest.dst, index, &|health| self.status(health)),
            None => Ok(()),
        }
        .map_err(|e| self.comm.translate(e))
    }

    /// Waits until every send started in `sends` has completed (its peer has read it).
    pub fn wait_sends(&self, sends: &mut Sends<'_>) -> Result<()> {
        for p in sends.pending.iter_mut() {
            if let Some(index) = p.index {
                let r = self.comm.net.send_wait(p.dst, index, &|health| self.status(health));
                // Done, or withdrawn by the wait on its way out: nothing is left to withdraw.
                p.index = None;
                r.map_err(|e| self.comm.translate(e))?;
            }
        }
        sends.pending.clear();
        Ok(())
    }

    fn header(&self, tag: u32, len: usize) -> FrameHeader {
        FrameHeader {
            kind: self.kind,
            comm_id: self.comm.id,
            epoch: self.comm.epoch,
            seq: self.seq,
            tag,
            len: len as u64,
            fp: *self.fp,
        }
    }

    /// The fingerprint of the call this context runs.
    pub fn fingerprint(&self) -> &'a Fingerprint {
        self.fp
    }

    pub fn send(&self, to: u32, tag: u32, data: &[u8]) -> Result<()> {
        let t = trace::start();
        let r = self.send_untraced(to, tag, data);
        if t.is_on() && r.is_ok() {
            trace::transfer(t, self.world_rank(), to, self.world(to).unwrap_or(to), data.len() as u64, true);
        }
        r
    }

    fn send_untraced(&self, to: u32, tag: u32, data: &[u8]) -> Result<()> {
        let hdr = self.header(tag, data.len());
        let dst = self.world(to)?;
        self.comm.net.send(dst, &hdr, data).map_err(|e| self.comm.translate(e))
    }

    /// Receives the next frame from `from`, which must carry `tag` and exactly `len` bytes.
    pub fn recv(&self, from: u32, tag: u32, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        self.recv_with(from, tag, len, &mut |_, piece| out.extend_from_slice(piece))?;
        Ok(out)
    }

    /// Receives the next frame from `from` (tag `tag`, exactly `len` bytes) and hands it to `f`
    /// as (offset, bytes) pieces in order; over shared memory the pieces are read in place, and
    /// they never split an element (every offset is a multiple of 16).
    pub fn recv_with(&self, from: u32, tag: u32, len: usize, f: &mut dyn FnMut(usize, &[u8])) -> Result<()> {
        self.recv_traced(from, tag, len, Out::Pieces(f))
    }

    fn recv_traced(&self, from: u32, tag: u32, len: usize, out: Out<'_>) -> Result<()> {
        let t = trace::start();
        let r = self.recv_untraced(from, tag, len, out);
        if t.is_on() && r.is_ok() {
            trace::transfer(t, self.world_rank(), from, self.world(from).unwrap_or(from), len as u64, false);
        }
        r
    }

    fn recv_untraced(&self, from: u32, tag: u32, len: usize, out: Out<'_>) -> Result<()> {
        let src = self.world(from)?;
        let key = Key { src, kind: self.kind, comm_id: self.comm.id, seq: self.seq };
        let mut check = |h: &FrameHeader| -> Result<()> {
            if h.fp != *self.fp {
                return Err(self.mismatch_with(from, &h.fp));
            }
            if h.len != len as u64 {
                // The calls agree, but not on this block: the per-rank counts of a v-collective.
                return Err(Error::new(
                    ErrorKind::Mismatch,
                    format!(
                        "ranks called {} with counts that do not match: rank {from} sent {} bytes where rank {} \
                         expected {len}",
                        super::fingerprint::describe(self.fp),
                        h.len,
                        self.rank()
                    ),
                )
                .with_failed(vec![from, self.rank()]));
            }
            if h.tag != tag {
                let e = Error::new(
                    ErrorKind::Transfer,
                    format!("rank {from} sent tag {} where tag {tag} was expected; connection closed", h.tag),
                );
                self.comm.net.refuse(src, e.message());
                return Err(e);
            }
            Ok(())
        };
        let mut sink = Sink { check: &mut check, out, expect: len };
        self.comm.net.recv(key, self.comm.timeout, &|health| self.status(health), &mut sink).map_err(|e| {
            match e.kind() {
                ErrorKind::Mismatch | ErrorKind::Transfer => e,
                ErrorKind::Timeout => self.send_instead(from).unwrap_or_else(|| self.comm.translate(e)),
                _ => self.comm.translate(e),
            }
        })
    }

    /// At the deadline of a collective's wait for `from`: a message `from` sent on this
    /// communicator, unreceived here, says that it called send where this rank called the
    /// collective.
    pub fn send_instead(&self, from: u32) -> Option<Error> {
        let src = self.world(from).ok()?;
        if self.kind != FrameKind::Collective {
            return None;
        }
        self.comm.net.drain(src);
        if !self.comm.net.inbox.holds_from(src, FrameKind::P2p, self.comm.id) {
            return None;
        }
        let ms = self.comm.timeout.as_millis();
        Some(
            Error::new(
                ErrorKind::Mismatch,
                format!(
                    "rank {from} has not joined {} within {ms} ms (HCCN_TIMEOUT_MS), and a point-to-point message \
                     it sent on this communicator waits here unreceived: its calls and this rank's differ (a send \
                     where this rank called a collective)",
                    super::fingerprint::describe(self.fp)
                ),
            )
            .with_failed(vec![from, self.rank()]),
        )
    }

    /// Receives the next frame from `from` (tag `tag`, exactly `dst.len()` bytes) into `dst`; a
    /// single-copy read lands there directly.
    pub fn recv_into(&self, from: u32, tag: u32, dst: &mut [u8]) -> Result<()> {
        self.recv_traced(from, tag, dst.len(), Out::Into(dst))
    }

    /// Receives into `dst` through `then`, which writes each piece of `dst` from the payload
    /// bytes where they lie, or, given `None`, from what a single-copy read landed in the piece
    /// (see [`Out::IntoThen`]).
    pub fn recv_into_then(&self, from: u32, tag: u32, dst: &mut [u8], then: &mut WritePiece<'_>) -> Result<()> {
        let len = dst.len();
        self.recv_traced(from, tag, len, Out::IntoThen(dst, then))
    }

    pub fn recv_reduce(&self, from: u32, tag: u32, dst: &mut [u8], dt: DataType, op: ReduceOp) -> Result<()> {
        let len = dst.len();
        self.recv_with(from, tag, len, &mut |off, piece| {
            reduce::reduce_into(&mut dst[off..off + piece.len()], piece, dt, op)
        })
    }

    /// Receives into `dst` combined with `base` (of `dst`'s length): `dst = base op received`,
    /// whatever `dst` held.
    pub fn recv_reduce_onto(
        &self,
        from: u32,
        tag: u32,
        dst: &mut [u8],
        base: &[u8],
        dt: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let len = dst.len();
        self.recv_with(from, tag, len, &mut |off, piece| {
            let end = off + piece.len();
            reduce::reduce_from(&mut dst[off..end], &base[off..end], piece, dt, op)
        })
    }

    /// Host index (0, 1, ... in order of first appearance) of every rank of the communicator,
    /// when every member's host is known.
    pub fn hosts(&self) -> Option<&[u32]> {
        self.comm.hosts()
    }

    pub fn send_chunked(&self, to: u32, tag: u32, data: &[u8]) -> Result<()> {
        self.chunks(data.len()).try_for_each(|r| self.send(to, tag, &data[r]))
    }

    /// Starts sending `data` to `to` in pipeline chunks (see [`Ctx::send_start`]) to a peer that
    /// is receiving them meanwhile, never first sending to us: the sends complete only once it
    /// has read them.
    pub fn send_chunked_start<'d>(
        &self,
        sends: &mut Sends<'d>,
        (to, tag): (u32, u32),
        data: &'d [u8],
        flow: Flow,
    ) -> Result<()>
    where
        'a: 'd,
    {
        self.chunks(data.len()).try_for_each(|r| self.send_start(sends, (to, tag), Cow::Borrowed(&data[r]), flow))
    }

    pub fn recv_chunked_into(&self, from: u32, tag: u32, dst: &mut [u8]) -> Result<()> {
        self.chunks(dst.len()).try_for_each(|r| self.recv_into(from, tag, &mut dst[r]))
    }
}

/// Sends started with [`Ctx::send_start`] whose peers may still be reading their data. Dropped
/// without [`Ctx::wait_sends`] (an operation that failed), it withdraws what was not read yet,
/// so that the operation never returns with a peer still reading its buffers.
#[derive(Default)]
pub(crate) struct Sends<'d> {
    /// Inline only: `Ctx::wait_oldest` keeps it within its inline room.
    pending: SmallVec<[Pending<'d>; 8]>,
}

struct Pending<'d> {
    comm: &'d Team,
    dst: u32,
    /// The transport's number for the send, until it completed or was withdrawn.
    index: Option<u64>,
    /// What the peer reads (kept alive, and borrowed from the caller, until then).
    _data: Cow<'d, [u8]>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(index) = self.index.take() {
            self.comm.net.send_withdraw(self.dst, index);
        }
    }
}
