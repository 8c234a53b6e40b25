//! Reading and writing one socket: whole frames out with `sendmsg`, payloads in without
//! zero-filling, and the peeks that let a receive take a frame that is all there.

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use super::LastHeard;
use crate::config::MAX_CHUNK_BYTES;
use crate::wire::{FrameHeader, FrameKind, HEADER_LEN};

/// Sends `head` then `payload` whole, with `sendmsg` of both (a small frame leaves in one
/// segment without being copied into a buffer of its own first), resuming after partial writes.
pub(crate) fn send_all(sock: &TcpStream, mut head: &[u8], mut payload: &[u8]) -> std::io::Result<()> {
    while !head.is_empty() || !payload.is_empty() {
        let mut iov = [
            libc::iovec { iov_base: head.as_ptr() as *mut libc::c_void, iov_len: head.len() },
            libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() },
        ];
        // SAFETY: a zeroed msghdr is valid (no name, no control data); it points at `iov`,
        // whose two entries cover exactly the readable `head` and `payload`.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        // SAFETY: as above; the fd is owned by `sock`.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_head = (n as usize).min(head.len());
        head = &head[from_head..];
        payload = &payload[n as usize - from_head..];
    }
    Ok(())
}

/// Sends a whole frame unless the socket cannot take its first byte now (a full buffer: the
/// peer is not reading); once a byte is out the rest follows, waiting if need be, so that a
/// frame is never left half written. True when sent.
pub(super) fn send_all_unless_full(sock: &TcpStream, head: &[u8], payload: &[u8]) -> bool {
    // SAFETY: `head` is a readable buffer of its length; the fd belongs to `sock`.
    let n = unsafe { libc::send(sock.as_raw_fd(), head.as_ptr().cast(), 1, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    n == 1 && send_all(sock, &head[1..], payload).is_ok()
}

/// Reads exactly `len` bytes into the empty `buf`'s reserved capacity: whatever the socket
/// holds at each call (`read_to_end` reads in pieces from 8 KiB up, a call each), and without
/// zero-filling first, which would touch every byte twice.
///
/// Every piece that arrives marks the link heard: a large frame crossing a slow link is a peer
/// that speaks, not a silent one.
pub(super) fn read_payload(
    fd: std::os::fd::RawFd,
    buf: &mut Vec<u8>,
    len: usize,
    heard: Option<&LastHeard>,
) -> std::io::Result<()> {
    buf.clear();
    buf.reserve_exact(len);
    while buf.len() < len {
        let want = len - buf.len();
        let spare = &mut buf.spare_capacity_mut()[..want];
        // SAFETY: `spare` is writable memory of its length inside `buf`'s allocation.
        let n = unsafe { recv_some(fd, spare.as_mut_ptr().cast(), spare.len()) }?;
        // SAFETY: the kernel initialised the first `n` bytes of `spare`, which follow `len()`.
        unsafe { buf.set_len(buf.len() + n) };
        if let Some(h) = heard {
            h.now();
        }
    }
    Ok(())
}

/// One `recv` of at most `len` (> 0) bytes into `ptr`: how many came. The end of the stream
/// is `UnexpectedEof`; an interrupted call is retried.
///
/// # Safety
/// `ptr` must be writable for `len` bytes; the caller keeps `fd` open.
pub(super) unsafe fn recv_some(fd: std::os::fd::RawFd, ptr: *mut u8, len: usize) -> std::io::Result<usize> {
    loop {
        // SAFETY: as the caller promises.
        let n = unsafe { libc::recv(fd, ptr.cast(), len, 0) };
        if n > 0 {
            return Ok(n as usize);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Reads and drops the bytes `skip` counts (the rest of a frame a receive gave up direct),
/// as far as `recv` with `flags` goes; how many are left.
pub(super) fn discard_skipped(fd: std::os::fd::RawFd, skip: &AtomicU64, flags: libc::c_int) -> std::io::Result<u64> {
    let mut left = skip.load(Ordering::SeqCst);
    let mut scratch = [0u8; 4096];
    while left > 0 {
        let want = scratch.len().min(left as usize);
        // SAFETY: `scratch` is writable memory of at least `want` bytes; the caller keeps `fd` open.
        let n = unsafe { libc::recv(fd, scratch.as_mut_ptr().cast(), want, flags) };
        if n > 0 {
            left -= n as u64;
            continue;
        }
        let e = if n == 0 { std::io::ErrorKind::UnexpectedEof.into() } else { std::io::Error::last_os_error() };
        if e.kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        skip.store(left, Ordering::SeqCst);
        return if e.kind() == std::io::ErrorKind::WouldBlock { Ok(left) } else { Err(e) };
    }
    skip.store(0, Ordering::SeqCst);
    Ok(0)
}

/// Reads exactly `buf.len()` bytes from `fd`.
pub(super) fn read_exact_fd(fd: std::os::fd::RawFd, buf: &mut [u8]) -> std::io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        let rest = &mut buf[off..];
        // SAFETY: `rest` is writable memory of its length.
        off += unsafe { recv_some(fd, rest.as_mut_ptr(), rest.len()) }?;
    }
    Ok(())
}

/// The bytes of the frame header at the head of `fd`'s stream, left there, once all have come.
pub(super) fn peek_header(fd: std::os::fd::RawFd) -> Option<[u8; HEADER_LEN]> {
    let mut head = [0u8; HEADER_LEN];
    // SAFETY: peeks at most HEADER_LEN bytes into `head`; the caller keeps `fd` open.
    let n = unsafe { libc::recv(fd, head.as_mut_ptr().cast(), HEADER_LEN, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    (n == HEADER_LEN as isize).then_some(head)
}

/// Payload bytes that [`whole_frame`] peeks beyond the header: a frame up to this size is then
/// taken whole by one more read.
pub(super) const PEEK_PAYLOAD: usize = 4096;

/// The header of the frame at the head of `fd`'s stream when all of it is there, and it is one
/// that a receive may take: a data frame or a plain heartbeat, with how many bytes of the
/// stream (header first) the call peeked into `buf`. Anything else, malformed frames
/// included, is the progress engine's to handle.
pub(super) fn whole_frame(
    fd: std::os::fd::RawFd,
    buf: &mut [u8; HEADER_LEN + PEEK_PAYLOAD],
) -> Option<(FrameHeader, usize)> {
    let mut avail: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int; the caller keeps `fd` open.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut avail) } != 0 || (avail as usize) < HEADER_LEN {
        return None;
    }
    // All that is there when it fits, else the header alone: a look at a large frame as it
    // arrives must not copy kilobytes each time.
    let want = if avail as usize <= buf.len() { avail as usize } else { HEADER_LEN };
    // SAFETY: peeks at most `want` <= buf.len() bytes into `buf`; the caller keeps `fd` open.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), want, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    let seen = usize::try_from(n).ok().filter(|&n| n >= HEADER_LEN)?;
    let hdr = FrameHeader::decode(buf[..HEADER_LEN].try_into().ok()?, MAX_CHUNK_BYTES).ok()?;
    match hdr.kind {
        FrameKind::Heartbeat if hdr.len == 0 => {}
        FrameKind::Collective | FrameKind::P2p | FrameKind::Agree => {}
        // Control frames, and malformed ones, are the engine's.
        _ => return None,
    }
    ((avail as u64) >= HEADER_LEN as u64 + hdr.len).then_some((hdr, seen))
}
