//! A peer's data channel, chosen once when the world forms: shared memory to a peer on this
//! host (shm/), TCP to the others (tcp/), the inbox to this rank itself. Collective and
//! point-to-point frames travel on it; control frames (goodbyes, suspicions, revokes,
//! agreement) always take the peer's TCP link. The rest of the runtime never asks which kind a
//! peer's channel is.
//!
//! While a channel's receive waits, frames queued for other waits must keep moving (a local
//! sender blocked on a full ring would otherwise wait for this receive in a cycle): that is the
//! world's one progress hook ([`Progress`]), which a channel calls between slices of its wait.

use std::sync::Arc;
use std::time::Duration;

use super::{poll_yielding, pool, Frame, Health, Inbox, Key, Sink};
use crate::error::{Error, Result};
use crate::wire::FrameHeader;

/// The world's progress hook: moves frames that wait on this rank's channels into the inbox.
pub(crate) type Progress = Arc<dyn Fn() + Send + Sync>;

/// What a receive's status check is (see [`Health`]).
pub(crate) type Status<'a> = &'a dyn Fn(&Health<'_>) -> Option<Error>;

/// What the receiver of a frame started with [`Channel::send_start`] does with it: where the
/// host's ranks outnumber their cores, that decides whether a same-host peer should read it in
/// place (see `Shm::single_copy`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Flow {
    /// Combines it with its own data as it arrives (the reduce steps of rings and halving-
    /// doubling): on crowded cores two copies through the ring's cached slots beat a read in
    /// place, whose reader reduces while the sender waits.
    Combined,
    /// Only stores it (allgather, scatter, alltoall, allreduce's second half): one copy wins on
    /// crowded cores too.
    Stored,
    /// Stored by a receiver that takes many blocks one after another beside its own copy (a
    /// gather's root): from a size on, the sender's copy into the ring, made while the receiver
    /// is busy, beats the receiver's read in place even where every rank has a core of its own
    /// (see linear.rs).
    Collected,
}

/// The data path to one peer.
pub(crate) trait Channel: Send + Sync {
    /// `"shm"`, `"tcp"` or `"self"`.
    fn name(&self) -> &'static str;

    /// Sends one data frame (it may still be on its way when this returns).
    fn send(&self, hdr: &FrameHeader, payload: &[u8]) -> Result<()>;

    /// Starts sending one data frame. `Some(number)` when the peer reads `payload` where it
    /// lies: then [`Channel::send_wait`] (or [`Channel::send_withdraw`]) must follow before
    /// `payload` changes or is freed. By default the frame is sent at once.
    fn send_start(&self, hdr: &FrameHeader, payload: &[u8], flow: Flow) -> Result<Option<u64>> {
        let _ = flow;
        self.send(hdr, payload).map(|()| None)
    }

    /// Waits until the peer has read the frame `send_start` numbered `index` and every
    /// earlier one; on an error, what it has not read is withdrawn.
    fn send_wait(&self, index: u64, status: Status<'_>) -> Result<()> {
        let _ = (index, status);
        Ok(())
    }

    /// Withdraws frame `index` unless the peer has begun to read it, then waits for that read.
    fn send_withdraw(&self, index: u64) {
        let _ = index;
    }

    /// Receives the frame `key`: `sink.check` sees its header, then `sink.out` its payload (in
    /// order, in pieces that never split an element). Bounded by `timeout`; ends early with
    /// the error `status` gives.
    fn recv(&self, key: Key, timeout: Duration, status: Status<'_>, sink: &mut Sink<'_, '_>) -> Result<()>;
}

/// Hands `frame` (taken from the inbox) to `sink`.
pub(crate) fn deliver(frame: Frame, sink: &mut Sink<'_, '_>) -> Result<()> {
    (sink.check)(&frame.hdr)?;
    if frame.landed {
        return Ok(());
    }
    sink.piece(0, &frame.payload);
    pool::give(frame.payload);
    Ok(())
}

/// This rank's channel to itself: frames go through its inbox.
pub(crate) struct SelfChannel {
    pub inbox: Arc<Inbox>,
    pub rank: u32,
}

impl Channel for SelfChannel {
    fn name(&self) -> &'static str {
        "self"
    }

    fn send(&self, hdr: &FrameHeader, payload: &[u8]) -> Result<()> {
        let mut copy = pool::take(payload.len());
        copy.extend_from_slice(payload);
        self.inbox.push(self.rank, Frame { hdr: *hdr, payload: copy, landed: false });
        Ok(())
    }

    fn recv(&self, key: Key, timeout: Duration, status: Status<'_>, sink: &mut Sink<'_, '_>) -> Result<()> {
        let frame = self.inbox.take(key, timeout, status, &|budget, ready| poll_yielding(budget, ready))?;
        deliver(frame, sink)
    }
}
