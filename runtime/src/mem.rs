//! Memory that ranks of one host read from each other without a system call per transfer
//! (`hccn_mem_alloc`, after NCCL's `ncclMemAlloc`). An allocation is a sealed memfd mapped into
//! this process; when a collective sends from it, the descriptor tells the peer which file and
//! where, and the peer maps the file once (`pidfd_getfd`, under the same ptrace permission as
//! `process_vm_readv`) and then copies or reduces with plain loads. Buffers from anywhere else go
//! through `process_vm_readv`, which pins every page of every transfer: on the machines we
//! measured that made single-copy reads 2-3x slower than memcpy (docs/algorithms.md).
//!
//! Both sides guard against the other: a freed region is unmapped here, but a peer's mapping
//! keeps the file alive and its size is sealed, so a late or hostile read never faults; the
//! peer checks the file it fetched is the inode the descriptor names, and that a transfer lies
//! inside it.

use crate::sync::RwLocked;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::error::{Error, ErrorKind, Result};

/// One allocation: where it is mapped here and the file behind it.
struct Region {
    base: usize,
    len: usize,
    fd: OwnedFd,
    id: u64,
    ino: u64,
}

static REGIONS: RwLock<Vec<Region>> = RwLock::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Regions freed so far: a peer that sees this change drops its mappings of this process, so
/// that freed memory does not stay alive in other processes.
static FREES: AtomicU64 = AtomicU64::new(0);

/// What a descriptor carries about the region its payload lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegionRef {
    pub id: u64,
    /// The region's file descriptor number in the sender.
    pub fd: u64,
    pub ino: u64,
    /// Where the region starts in the sender's address space, and its length.
    pub base: u64,
    pub len: u64,
    /// The sender's count of freed regions when it posted the descriptor.
    pub frees: u64,
}

impl RegionRef {
    pub const WORDS: usize = 6;

    pub fn words(&self) -> [u64; Self::WORDS] {
        [self.id, self.fd, self.ino, self.base, self.len, self.frees]
    }

    pub fn from_words(w: [u64; Self::WORDS]) -> RegionRef {
        RegionRef { id: w[0], fd: w[1], ino: w[2], base: w[3], len: w[4], frees: w[5] }
    }
}

fn os_error(what: &str) -> Error {
    let e = std::io::Error::last_os_error();
    let kind = match e.raw_os_error() {
        Some(libc::ENOMEM | libc::ENOSPC | libc::EFBIG) => ErrorKind::OutOfMemory,
        _ => ErrorKind::System,
    };
    Error::io(kind, what, &e)
}

/// Allocates `len` zeroed bytes that same-host peers can map (see the module comment).
pub fn alloc(len: usize) -> Result<NonNull<u8>> {
    if len == 0 {
        return Err(Error::invalid("hccn_mem_alloc of 0 bytes"));
    }
    let page = 4096usize;
    let size = len.checked_next_multiple_of(page).ok_or_else(|| Error::invalid(format!("{len} bytes")))?;
    // SAFETY: a fresh memfd with a NUL-terminated name; checked below.
    let raw = unsafe { libc::memfd_create(c"hccn-mem".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(os_error("memfd_create"));
    }
    // SAFETY: `raw` is a descriptor we just opened and own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain calls on our own descriptor; results checked.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
        return Err(os_error(&format!("sizing {size} bytes of shareable memory")));
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(os_error("sealing shareable memory"));
    }
    let ino = stat(&fd).map_err(|e| Error::io(ErrorKind::System, "fstat", &e))?.st_ino;
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: a fresh shared mapping of the whole file; checked for MAP_FAILED.
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), size, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
    if ptr == libc::MAP_FAILED {
        return Err(os_error(&format!("mapping {size} bytes of shareable memory")));
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut regions = REGIONS.write_locked();
    regions.push(Region { base: ptr as usize, len: size, fd, id, ino });
    NonNull::new(ptr.cast()).ok_or_else(|| Error::internal("mmap returned null"))
}

/// Frees what [`alloc`] returned.
///
/// # Safety
/// Nothing may use the memory afterwards (no operation still in flight over it).
pub unsafe fn free(ptr: *mut u8) -> Result<()> {
    let region = {
        let mut regions = REGIONS.write_locked();
        let Some(i) = regions.iter().position(|r| r.base == ptr as usize) else {
            return Err(Error::invalid(format!("{ptr:p} was not returned by hccn_mem_alloc (or is freed already)")));
        };
        regions.swap_remove(i)
    };
    FREES.fetch_add(1, Ordering::SeqCst);
    // SAFETY: exactly the mapping `alloc` made; the caller promises nothing uses it.
    unsafe { libc::munmap(region.base as *mut libc::c_void, region.len) };
    Ok(())
}

/// The region that holds all of `addr..addr + len`, if it is shareable memory.
pub(crate) fn find(addr: usize, len: usize) -> Option<RegionRef> {
    let regions = REGIONS.read_locked();
    let r = regions.iter().find(|r| addr >= r.base && addr.saturating_add(len) <= r.base + r.len)?;
    Some(RegionRef {
        id: r.id,
        fd: r.fd.as_raw_fd() as u64,
        ino: r.ino,
        base: r.base as u64,
        len: r.len as u64,
        frees: FREES.load(Ordering::SeqCst),
    })
}

/// The file behind `fd`'s status (inode, size).
fn stat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: `st` is a plain struct the kernel fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live descriptor and a writable stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// `len` zeroed bytes of shareable memory, freed on drop (the Rust face of [`alloc`]).
#[derive(Debug)]
pub struct SharedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by this value.
unsafe impl Send for SharedBuf {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for SharedBuf {}

impl SharedBuf {
    pub fn new(len: usize) -> Result<SharedBuf> {
        Ok(SharedBuf { ptr: alloc(len.max(1))?, len })
    }
}

impl std::ops::Deref for SharedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `alloc` mapped at least `len` bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for SharedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for SharedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc` and no borrow of `self` outlives it.
        let _ = unsafe { free(self.ptr.as_ptr()) };
    }
}

/// A peer region mapped read-only into this process.
struct Mapped {
    id: u64,
    base: u64,
    len: usize,
    ptr: *const u8,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping `PeerMaps::map` made; no view of it outlives `&mut self`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Mappings kept per peer; the oldest goes beyond this many.
const MAX_MAPPED: usize = 16;

/// One peer's regions mapped into this process, by the receiver of its descriptors.
#[derive(Default)]
pub(crate) struct PeerMaps {
    pidfd: Option<OwnedFd>,
    /// A policy forbids taking the peer's descriptors: `process_vm_readv` from then on.
    refused: bool,
    frees: u64,
    maps: Vec<Mapped>,
}

// SAFETY: the raw pointers are private read-only mappings owned by this value.
unsafe impl Send for PeerMaps {}

impl PeerMaps {
    /// The bytes at `addr..addr + len` in process `pid`, which lie in region `r` of it, mapped
    /// into this process; `None` when the region cannot be mapped (read them another way). An
    /// error when the range lies outside the region: the peer is out of step.
    pub fn view(&mut self, pid: i32, r: &RegionRef, addr: u64, len: usize) -> Result<Option<&[u8]>> {
        let off = addr.checked_sub(r.base).filter(|o| o.checked_add(len as u64).is_some_and(|end| end <= r.len));
        let Some(off) = off else {
            return Err(Error::new(
                ErrorKind::Transfer,
                format!("a transfer of {len} bytes at {addr:#x} outside its region ({:#x}, {} bytes)", r.base, r.len),
            ));
        };
        if r.frees != self.frees {
            // The peer freed something since: drop every mapping, rather than keep its memory.
            self.maps.clear();
            self.frees = r.frees;
        }
        if self.refused {
            return Ok(None);
        }
        let i = match self.maps.iter().position(|m| m.id == r.id && m.base == r.base && m.len as u64 == r.len) {
            Some(i) => i,
            None => match self.map(pid, r) {
                Ok(m) => {
                    tracing::info!(pid, bytes = r.len, "mapped a peer's shareable memory");
                    if self.maps.len() >= MAX_MAPPED {
                        self.maps.remove(0);
                    }
                    self.maps.push(m);
                    self.maps.len() - 1
                }
                Err(e) => {
                    tracing::debug!(pid, "mapping a peer's shareable memory failed ({e}); process_vm_readv instead");
                    self.refused = matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES | libc::ENOSYS));
                    return Ok(None);
                }
            },
        };
        let m = &self.maps[i];
        // SAFETY: `off + len <= r.len == m.len`, inside the mapping, which lives as long as the
        // borrow of `self`; the sender leaves the bytes alone until the transfer is acknowledged.
        Ok(Some(unsafe { std::slice::from_raw_parts(m.ptr.add(off as usize), len) }))
    }

    /// How many of the peer's regions are mapped here.
    #[cfg(test)]
    pub fn mapped(&self) -> usize {
        self.maps.len()
    }

    fn map(&mut self, pid: i32, r: &RegionRef) -> std::io::Result<Mapped> {
        let err = std::io::Error::last_os_error;
        if self.pidfd.is_none() {
            // SAFETY: plain system call; the result is checked.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            if fd < 0 {
                return Err(err());
            }
            // SAFETY: a descriptor we just opened and own.
            self.pidfd = Some(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        let pidfd = self.pidfd.as_ref().map(|f| f.as_raw_fd()).unwrap_or(-1);
        let target = i32::try_from(r.fd).map_err(|_| std::io::Error::other("descriptor number out of range"))?;
        // SAFETY: as above.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, target, 0) };
        if fd < 0 {
            return Err(err());
        }
        // SAFETY: a descriptor the kernel just gave us.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // The number may since have been closed and reused for another file: it must be the
        // region's, sealed against shrinking (so that reading it never faults).
        let st = stat(&fd)?;
        // SAFETY: as above.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if st.st_ino != r.ino || seals < 0 || seals & libc::F_SEAL_SHRINK == 0 || (st.st_size as u64) < r.len {
            return Err(std::io::Error::other("the descriptor number names another file now"));
        }
        let len = usize::try_from(r.len).map_err(|_| std::io::Error::other("region too large"))?;
        // SAFETY: a fresh read-only shared mapping of a file at least `len` bytes long that can
        // never shrink; checked for MAP_FAILED.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(err());
        }
        Ok(Mapped { id: r.id, base: r.base, len, ptr: ptr.cast() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_is_found_by_any_range_inside_it_and_freed_once() {
        let mut b = SharedBuf::new(10_000).expect("alloc");
        b[9_999] = 7;
        let base = b.as_ptr() as usize;
        let r = find(base + 100, 9_000).expect("inside");
        assert_eq!((r.base, r.len), (base as u64, 12_288), "whole pages");
        assert!(find(base + 100, 20_000).is_none(), "runs past the end");
        assert!(find(base - 1, 2).is_none(), "starts before");
        let p = b.as_mut_ptr();
        drop(b);
        assert!(find(base, 1).is_none(), "freed");
        // SAFETY: `p` is no longer a region: refused, nothing is unmapped.
        let e = unsafe { free(p) }.err().map(|e| e.kind());
        assert_eq!(e, Some(ErrorKind::InvalidArgument));
        assert_eq!(alloc(0).err().map(|e| e.kind()), Some(ErrorKind::InvalidArgument));
    }

    #[test]
    fn a_peer_maps_a_region_once_and_refuses_ranges_outside_it() {
        let mut b = SharedBuf::new(64 << 10).expect("alloc");
        b.iter_mut().enumerate().for_each(|(i, x)| *x = (i % 251) as u8);
        let base = b.as_ptr() as u64;
        let r = find(base as usize, b.len()).expect("region");
        let me = std::process::id() as i32;
        let mut maps = PeerMaps::default();
        let seen = maps.view(me, &r, base + 10, 100).expect("in range").map(|v| v.to_vec());
        assert_eq!(seen.as_deref(), Some(&b[10..110]));
        b[10] = 99;
        let again = maps.view(me, &r, base + 10, 1).expect("in range").map(|v| v[0]);
        assert_eq!(again, Some(99), "the same pages, mapped once");
        assert_eq!(maps.maps.len(), 1);
        let e = maps.view(me, &r, base + (64 << 10) - 4, 8).err().map(|e| e.kind());
        assert_eq!(e, Some(ErrorKind::Transfer), "past the end");
        assert!(maps.view(me, &r, base - 8, 8).is_err(), "before the start");
        // A descriptor naming a file that is not the region (wrong inode): not mapped, and
        // the next one is mapped all the same.
        let bogus = RegionRef { ino: r.ino ^ 1, id: r.id + 1000, ..r };
        assert!(maps.view(me, &bogus, base, 8).expect("in range").is_none());
        let other = SharedBuf::new(4096).expect("alloc");
        let r2 = find(other.as_ptr() as usize, 4096).expect("region");
        assert!(maps.view(me, &r2, r2.base, 4096).expect("in range").is_some());
        // The sender freed a region: every mapping goes.
        drop(b);
        let r2 = find(other.as_ptr() as usize, 4096).expect("region");
        assert!(maps.view(me, &r2, r2.base, 4096).expect("in range").is_some());
        assert_eq!(maps.maps.len(), 1, "only the live region is mapped again");
    }
}
