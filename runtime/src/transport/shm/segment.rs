//! A shared-memory file mapped into this process, and the identity of the host it lives on.

use std::os::fd::AsRawFd;

/// Identity of the host this process runs on: boot id, host name, and network and mount
/// namespaces (two namespace "hosts" on one machine are different hosts).
pub(crate) type HostId = [u8; 32];

pub(crate) fn host_id() -> HostId {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default());
    let mut name = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length, which is what we pass.
    if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0 {
        h.update(name);
    }
    for ns in ["/proc/self/ns/net", "/proc/self/ns/mnt", "/proc/self/ns/ipc"] {
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(ns).map(|m| m.ino()).unwrap_or(0);
        h.update(ino.to_le_bytes());
    }
    h.finalize().into()
}

/// A mapped segment; unmapped on drop (the other process keeps its own mapping).
pub(crate) struct Segment {
    pub(crate) ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics or through
// slots whose ownership the ring protocol hands from one side to the other.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing refers to it any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
        crate::transport::usage::unmapped(self.len);
    }
}

impl Segment {
    /// Creates the file at `path` (which must not exist) with all of its `len` bytes reserved,
    /// and maps it. A file only sized would take its pages as they are first touched, and a
    /// /dev/shm too small for them (Docker's 64 MiB) would then kill the process with SIGBUS:
    /// here it fails instead (ENOSPC), with the file removed, and the caller falls back.
    pub(crate) fn create(path: &str, len: usize) -> std::io::Result<Segment> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(path)?;
        // SAFETY: a descriptor we hold; posix_fallocate takes no pointers.
        let reserved = match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) } {
            0 => Segment::map(&file, len),
            errno => Err(std::io::Error::from_raw_os_error(errno)),
        };
        if reserved.is_err() {
            let _ = std::fs::remove_file(path);
        }
        reserved.map_err(|e| short_of_shared_memory(e, len))
    }

    pub(crate) fn map(file: &std::fs::File, len: usize) -> std::io::Result<Segment> {
        // SAFETY: a fresh shared mapping of a file we hold open; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        crate::transport::usage::mapped(len);
        Ok(Segment { ptr: ptr.cast(), len })
    }
}

/// Says once per process that shared memory could not be had for `what` (later misses are
/// debug lines: a full /dev/shm fails every pair alike), and what is used instead.
pub(crate) fn fell_back(what: &str, e: &std::io::Error, instead: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::debug!("no shared memory for {what} ({e}); {instead}");
    } else {
        tracing::warn!("no shared memory for {what} ({e}); {instead} (said once; the rest at debug level)");
    }
}

/// `e`, said in the user's terms when /dev/shm is full: its size and what was free.
fn short_of_shared_memory(e: std::io::Error, len: usize) -> std::io::Error {
    if e.raw_os_error() != Some(libc::ENOSPC) {
        return e;
    }
    // SAFETY: statvfs is a plain C struct of integers, for which all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs struct to fill.
    let known = unsafe { libc::statvfs(c"/dev/shm".as_ptr(), &mut st) } == 0;
    let mib = |blocks: u64| blocks * st.f_frsize / (1 << 20);
    let room = match known {
        true => format!("/dev/shm holds {} MiB, {} MiB free", mib(st.f_blocks), mib(st.f_bavail)),
        false => "the size of /dev/shm is unknown".to_owned(),
    };
    std::io::Error::other(format!(
        "/dev/shm is full: {room}, {} KiB were needed (a container's default is 64 MiB; give it more, e.g. docker \
         --shm-size=1g)",
        len >> 10
    ))
}

/// Writes up to this size are pushed into the shared cache whole (see [`demote`]): a larger one
/// is read at the speed of the copy, and pushing it out costs the writer (4 KiB board posts:
/// broadcasts 40 % slower).
const DEMOTE_UP_TO: usize = 256;

/// [`demote`]s every line of the `len` bytes at `p` when they are few (see [`DEMOTE_UP_TO`]).
#[inline(always)]
pub(crate) fn demote_small(p: *const u8, len: usize) {
    if len <= DEMOTE_UP_TO {
        (0..len).step_by(64).for_each(|at| demote(p.wrapping_add(at)));
    }
}

/// Pushes the cache line at `p` out of this core's private caches into the shared one, where
/// another core's miss finds it sooner than in this core's (`cldemote`: a hint, a no-op on
/// cores without it). 2 ranks on 2 cores, 64 bytes: allreduce 0.79 -> 0.69 µs per call,
/// alltoall 0.82 -> 0.65; 4 ranks 3-11 % faster, but a gather 7-17 % slower.
#[inline(always)]
pub(crate) fn demote(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: cldemote neither faults nor writes (it is a NOP where unsupported); `p` points
    // into a live mapping anyway.
    unsafe {
        std::arch::asm!("cldemote [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
