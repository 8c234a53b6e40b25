//! Where a received payload goes: the receive's checks and its destination, the same for every
//! channel (shared memory reads pieces in place, TCP hands over a frame or lands it).

use crate::error::Result;
use crate::wire::FrameHeader;

/// What a receive hands its caller: the checked header first, then the payload.
pub(crate) struct Sink<'a, 'b> {
    pub check: &'a mut dyn FnMut(&FrameHeader) -> Result<()>,
    pub out: Out<'b>,
    /// The payload length expected, at most (`check` has the last word): how a receive waits.
    pub expect: usize,
}

/// Where a received payload goes.
pub(crate) enum Out<'a> {
    /// To a function, in (offset, bytes) pieces in order.
    Pieces(&'a mut dyn FnMut(usize, &[u8])),
    /// Into a buffer of the frame's length (checked by `check`), where a single-copy read lands
    /// directly.
    Into(&'a mut [u8]),
    /// Into a buffer of the frame's length, piece by piece through a function that writes the
    /// piece of the buffer at an offset: `f(dst, Some(bytes), off)` where the payload bytes lie
    /// in memory this process can read (a ring slot, a peer's mapped region), `f(dst, None, off)`
    /// where they have landed in `dst` already (a single-copy read), while still in cache. A
    /// reduction thus writes `dst` once and never reads it from memory first.
    IntoThen(&'a mut [u8], &'a mut WritePiece<'a>),
}

/// Writes the piece `dst` of a buffer at an offset, from the payload bytes where they lie or
/// (`None`) from what has landed in `dst` (see [`Out::IntoThen`]).
pub(crate) type WritePiece<'a> = dyn FnMut(&mut [u8], Option<&[u8]>, usize) + 'a;

impl Sink<'_, '_> {
    /// Hands over the payload bytes at `off`.
    pub fn piece(&mut self, off: usize, bytes: &[u8]) {
        match &mut self.out {
            Out::Pieces(f) => f(off, bytes),
            Out::Into(buf) => {
                if let Some(dst) = buf.get_mut(off..off + bytes.len()) {
                    dst.copy_from_slice(bytes);
                }
            }
            Out::IntoThen(buf, then) => {
                if let Some(dst) = buf.get_mut(off..off + bytes.len()) {
                    then(dst, Some(bytes), off);
                }
            }
        }
    }
}
