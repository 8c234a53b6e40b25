//! A call that this rank refuses (an argument fails a check here) still takes its place among the
//! other ranks' calls. A check can pass on one rank and fail on another (a root's overlapping
//! buffers, a NULL on one rank only): had the refusing rank just returned, its next call would
//! pair with the others' refused one, and every rank could get success with another call's data.
//!
//! So a refused collective takes the sequence number and board turn the call would have taken
//! and runs the call's round with nothing to move, under its fingerprint marked refused: every
//! other rank of the call fails with MISMATCH naming this rank, and hears why (the refusal goes
//! out as the reason this rank left the call). Where every rank refused alike, the refused
//! fingerprints agree, the round passes and each rank returns its own refusal. Either way the
//! next call pairs with the next call everywhere. A refused send sends its receiver an empty
//! frame under the refused fingerprint, which fails the matching receive; a refused receive
//! takes its sequence number and drops the matching frame when it comes.

use std::sync::atomic::Ordering;

use super::{CommInner, Communicator, Planned, BROKEN_MARK};
use crate::collectives::{self, fingerprint, Ctx, Op, Work};
use crate::error::{Error, ErrorKind};
use crate::stream::Stream;
use crate::transport::Key;
use crate::wire::{Fingerprint, FrameKind};

impl Communicator {
    /// Takes the place of `op` (fingerprint `fp`), which this rank refused with `refusal`, in the
    /// order of the communicator's calls; returns the refusal.
    pub(super) fn refuse(&self, op: &Op, fp: Fingerprint, refusal: Error, stream: Option<&Stream>) -> Error {
        let inner = &self.inner;
        match *op {
            Op::Send { peer, .. } if peer < self.size() => {
                let seq = inner.next_p2p(true, peer);
                let refused = fingerprint::refused(&fp);
                // Sent at once, as a send's frames are: it only has to reach the receiver.
                let _ = Ctx::new(inner, FrameKind::P2p, seq).with_fingerprint(&refused).send(peer, 0, &[]);
            }
            Op::Recv { peer, .. } if peer < self.size() => {
                let seq = inner.next_p2p(false, peer);
                if let Some(&src) = inner.members.get(peer as usize) {
                    inner.net.inbox.give_up(Key { src, kind: FrameKind::P2p, comm_id: inner.id, seq });
                }
            }
            // No such peer: there is no call to pair with.
            Op::Send { .. } | Op::Recv { .. } => {}
            _ => {
                let seq = inner.coll_seq.fetch_add(1, Ordering::SeqCst);
                let turn = inner.board.turn_for(&fp);
                let plan = Planned { kind: FrameKind::Collective, seq, turn, fp: fingerprint::refused(&fp) };
                let why = refusal.clone();
                match stream {
                    None => take_part(&plan, inner, &why),
                    Some(s) => {
                        let queued_inner = self.inner.clone();
                        // The caller has the refusal already: the stream's own state stays clean.
                        let queued = s.enqueue(Box::new(move || {
                            take_part(&plan, &queued_inner, &why);
                            Ok(())
                        }));
                        if let Err(e) = queued {
                            // The round never runs: the others must not wait for it.
                            inner.tell_abandoned(seq, &e.context("a refused call could not be queued"), true);
                        }
                    }
                }
            }
        }
        refusal
    }
}

impl Communicator {
    /// [`Communicator::refuse`] for a call refused before it reached [`Communicator::submit`]
    /// (a stream of another backend), run in no stream.
    pub(crate) fn refuse_call(&self, op: &Op, refusal: Error) -> Error {
        self.refuse(op, fingerprint::of(op), refusal, None)
    }

    /// [`Communicator::refuse`] for a call of `kind` (an `Op::name`) whose other arguments this
    /// rank could not read (an unknown data type or reduce operation, a NULL counts array):
    /// `peer` for a send or receive. Its size is unknown, so it goes wherever a call of its kind
    /// may go (see `fingerprint::board_post`): where every rank refused alike, the round passes;
    /// where the others' calls went to the board too, they fail against it. Only where their
    /// calls took the message path does the round not end before the timeout, and then the
    /// ranks number their board calls differently: the communicator breaks (see `take_part`).
    pub fn refuse_unread(&self, kind: &str, peer: Option<u32>, refusal: Error, stream: Option<&Stream>) -> Error {
        let fp = fingerprint::refused_unread(kind);
        let op = match peer {
            Some(peer) => {
                let (buf, count, dt) = (crate::collectives::Ptr::null(), 0, crate::types::DataType::Uint8);
                if kind == "send" {
                    Op::Send { buf, count, dt, peer }
                } else {
                    Op::Recv { buf, count, dt, peer }
                }
            }
            // Any collective: its round is the refused fingerprint's.
            None => Op::Barrier,
        };
        self.refuse(&op, fp, refusal, stream)
    }
}

/// Runs the refused call's round (nothing moves); when another rank's call differs, tells every
/// member why this rank did not make it.
fn take_part(plan: &Planned, inner: &CommInner, refusal: &Error) {
    let ctx = Ctx::new(inner, plan.kind, plan.seq).with_turn(plan.turn).with_fingerprint(&plan.fp);
    // SAFETY: `Work::Nothing` touches no caller memory.
    let Err(e) = (unsafe { collectives::execute(&ctx, &Work::Nothing) }) else {
        return;
    };
    match e.kind() {
        // The communicator's own failure, already known to every member.
        ErrorKind::RankFailed | ErrorKind::Revoked | ErrorKind::Aborted => {}
        // The ranks now number their board turns differently.
        ErrorKind::Mismatch if e.message().contains(BROKEN_MARK) => inner.abandon(plan.seq, &e),
        // A board round that did not end: the others took the message path (a refused call
        // whose size this rank could not read), so their board turns and this rank's differ.
        ErrorKind::Timeout if plan.turn.is_some() => {
            let why = format!(
                "rank {} refused a call whose arguments it could not read ({}) while the others made it; \
                 the ranks now number their shared-memory calls differently: {BROKEN_MARK}",
                inner.rank,
                refusal.message()
            );
            inner.tell_abandoned(plan.seq, &Error::new(ErrorKind::Mismatch, why).with_failed(vec![inner.rank]), true);
        }
        _ => {
            let why = format!("rank {} refused its call: {}", inner.rank, refusal.message());
            inner.tell_abandoned(plan.seq, &Error::new(ErrorKind::Mismatch, why).with_failed(vec![inner.rank]), false);
        }
    }
}
