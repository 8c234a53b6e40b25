//! When each rank ended, for the exit code of the job (the first failure's, by time). A thread
//! per rank, ahead of ordinary threads where that is allowed, waits for the rank's end and
//! timestamps it; the monitor reaps the ranks in that order.
//!
//! The time taken is the moment the process began to close its descriptors as it ended. Its
//! peers learn of its death from its sockets closing and fail in turn, possibly before the
//! kernel has reported the first process's end to its parent (which comes after every
//! descriptor is released), so the parent's notice alone could put a survivor's failure first.
//! Each rank therefore holds the write end of a lifeline pipe at a descriptor number above any
//! it opens itself ([`LIFELINE_LIMIT`]): the kernel releases an ending process's descriptors from
//! the highest number down, so the lifeline hangs up before any of its sockets closes. A
//! lifeline that hung up well before the end (a program that closes descriptors it did not
//! open) is not the end; the end is then the kernel's notice.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A process (its index among the job's) ended at this time.
pub(super) type Ended = (usize, Instant);

/// A hang-up of the lifeline this long before the end belongs to the process's life, not to its
/// exit.
const CLOSED_AT_EXIT: Duration = Duration::from_millis(50);

/// The lifeline's descriptor number in a rank is below this (and below its open-file limit): a
/// higher number would make every rank's descriptor table that large.
pub(super) const LIFELINE_LIMIT: u64 = 4096;

/// The descriptor number of the lifeline in the ranks: the highest one their open-file limit
/// allows, up to [`LIFELINE_LIMIT`].
pub(super) fn lifeline_fd() -> i32 {
    // SAFETY: a zeroed rlimit is a valid out-parameter.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `lim` is a valid rlimit to fill.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 1024 };
    (soft.clamp(16, LIFELINE_LIMIT) - 1) as i32
}

/// A lifeline: the read end for hccnrun, the write end for the rank (both close-on-exec; the
/// rank's copy is placed at [`lifeline_fd`] before its program starts).
pub(super) fn lifeline() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two descriptors just made for us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn pidfd(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    // SAFETY: a descriptor just opened for us.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits (without reaping) for our child `pid` to end.
fn wait_for_end(pid: i32) {
    loop {
        // SAFETY: zeroed siginfo_t is a valid out-parameter.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits for our own child, leaving it to be reaped.
        let rc = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// When the process behind `pidfd` ended, watching its `lifeline` for the hang-up.
fn end_time(pidfd: &OwnedFd, lifeline: Option<&OwnedFd>) -> Instant {
    let mut fds: Vec<libc::pollfd> = std::iter::once(pidfd)
        .chain(lifeline)
        .map(|f| libc::pollfd { fd: f.as_raw_fd(), events: 0, revents: 0 })
        .collect();
    fds[0].events = libc::POLLIN;
    let mut hung_up = None;
    loop {
        // SAFETY: `fds` is a live array of its length.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        let now = Instant::now();
        if rc < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return now;
        }
        for p in fds[1..].iter_mut().filter(|p| p.revents != 0) {
            // A negative descriptor is left out of later polls.
            p.fd = -1;
        }
        if hung_up.is_none() && fds.len() > 1 && fds[1].fd < 0 {
            hung_up = Some(now);
        }
        if fds[0].revents != 0 {
            return match hung_up {
                Some(h) if now.duration_since(h) <= CLOSED_AT_EXIT => h,
                _ => now,
            };
        }
    }
}

/// Starts the thread that waits for rank `slot` (process `pid`, index `index`) and sends when it
/// ended; `lifeline`: the read end of its lifeline.
pub(super) fn watch(
    index: usize,
    slot: u32,
    pid: i32,
    lifeline: Option<OwnedFd>,
    tx: Sender<Ended>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(format!("rank{slot}-exit")).stack_size(64 << 10).spawn(move || {
        let param = libc::sched_param { sched_priority: 1 };
        // SAFETY: sets this thread's own policy; failing (no privilege) leaves it as it was.
        unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
        let at = match pidfd(pid) {
            Some(fd) => {
                let at = end_time(&fd, lifeline.as_ref());
                // The pidfd is readable once the process has ended; make sure it is a zombie
                // for the monitor to reap.
                wait_for_end(pid);
                at
            }
            None => {
                wait_for_end(pid);
                Instant::now()
            }
        };
        let _ = tx.send((index, at));
    })
}
