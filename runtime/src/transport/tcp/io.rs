//! Reading and writing one socket: whole frames out with `sendmsg`, and the exact reads and
//! peeks that let a receive land a frame straight in its own buffer.

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::wire::HEADER_LEN;

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

/// The kernel's count of segments with data received on socket `fd` (`tcpi_data_segs_in`,
/// Linux 4.6+), those held out of order included: the peer's bytes reached this host even
/// when none can be read yet.
pub(crate) fn data_segments_in(fd: std::os::fd::RawFd) -> Option<u32> {
    // Offset of tcpi_data_segs_in in the kernel's struct tcp_info (uapi/linux/tcp.h).
    const AT: usize = 152;
    let mut info = [0u8; 256];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes, which the kernel fills up to what it has.
    let r = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, info.as_mut_ptr().cast(), &mut len) };
    let got = &info[..(len as usize).min(info.len())];
    let bytes = got.get(AT..AT + 4).filter(|_| r == 0)?;
    Some(u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}
