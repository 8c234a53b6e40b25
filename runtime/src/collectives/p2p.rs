//! Send and receive. Frames carry a per-pair sequence number, so messages between two ranks
//! match in the order they were issued (MPI's non-overtaking rule) on any stream. A send
//! completes once its bytes are handed to the transport; it never waits for the receive.

use super::Ctx;
use crate::error::Result;

pub(crate) fn send(ctx: &Ctx<'_>, data: &[u8], peer: u32) -> Result<()> {
    match data.is_empty() {
        // One empty frame, which its receive checks against its own call.
        true => ctx.send(peer, 0, data),
        false => ctx.send_chunked(peer, 0, data),
    }
}

pub(crate) fn recv(ctx: &Ctx<'_>, data: &mut [u8], peer: u32) -> Result<()> {
    match data.is_empty() {
        true => ctx.recv_into(peer, 0, data),
        false => ctx.recv_chunked_into(peer, 0, data),
    }
}
