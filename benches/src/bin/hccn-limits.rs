//! What this machine allows an allreduce, measured without hccn: the floors that two of the
//! performance targets run into (benches/compare.sh prints them beside its table).
//!
//! Usage: hccn-limits [--quick]
//!
//! - `cross-process read`: two processes, each reading the other's private 64 MiB buffer with
//!   process_vm_readv at the same time, in 256 KiB pieces into a scratch buffer that stays in
//!   cache (as hccn's single-copy path does), beside the same two processes copying their own
//!   64 MiB with memcpy at the same time. In a 2-rank allreduce of heap buffers each rank must
//!   bring busbw x time bytes out of its peer's private memory, so this rate bounds the busbw of
//!   any single-copy path; only buffers the peers can map (`hccn_mem_alloc`) get past it.
//! - `allreduce of heap buffers`: the same two processes run a 64 MiB fp32 sum allreduce by
//!   hccn's single-copy scheme, written out here: each reads its half of the peer's input into its
//!   output in PIECE pieces and adds its own input while the piece is in cache, then reads the
//!   peer's reduced half. Busbw; what hccn's heap-buffer path can reach on this machine.
//! - `post and wait`: n processes, each posting a sequence word in shared memory and waiting
//!   until all n have posted, round after round: a 4-byte allreduce with the data, checks and
//!   API taken away. Waiters spin when every process has a core, and yield on every look when
//!   they outnumber the cores (which measured fastest here); time per round. With more
//!   processes than cores every round costs context switches, whatever the library.
//!
//! Each figure is the median of 5 repetitions. A process that waits over 10 s for another gives
//! up and the figure is reported as failed: nothing here can hang.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hccn_benches::percentile;

const LINE: usize = 64;
const PIECE: usize = 256 << 10;
const GIVE_UP: Duration = Duration::from_secs(10);

/// An anonymous shared mapping of `LINE`-sized words, inherited by forked children.
struct Shared {
    ptr: *mut u8,
    len: usize,
}

impl Shared {
    fn new(words: usize) -> Shared {
        let len = words * LINE;
        // SAFETY: a fresh anonymous shared mapping; checked below.
        let ptr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(ptr != libc::MAP_FAILED, "mmap failed: {}", std::io::Error::last_os_error());
        Shared { ptr: ptr.cast(), len }
    }
    /// Word `i`, alone on its cache line.
    fn word(&self, i: usize) -> &AtomicU64 {
        assert!((i + 1) * LINE <= self.len);
        // SAFETY: inside the mapping, 64-byte aligned, only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.ptr.add(i * LINE).cast()) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Waits until `ready`, spinning or yielding; false after GIVE_UP.
fn wait_for(ready: impl Fn() -> bool, yield_each_look: bool) -> bool {
    let start = Instant::now();
    let mut looks = 0u32;
    while !ready() {
        if yield_each_look {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        looks = looks.wrapping_add(1);
        if looks.is_multiple_of(1024) && start.elapsed() > GIVE_UP {
            return false;
        }
    }
    true
}

/// Waits, in a pair of processes whose barrier counters are words 2 and 3 of `shared`, until
/// the other process has reached `phase` too; false after GIVE_UP.
fn barrier(shared: &Shared, me: usize, phase: u64) -> bool {
    shared.word(2 + me).store(phase, Ordering::Release);
    wait_for(|| shared.word(3 - me).load(Ordering::Acquire) >= phase, false)
}

/// The other process of a pair, met (see [`meet`]).
struct Pair<'a> {
    shared: &'a Shared,
    me: usize,
    peer: libc::pid_t,
    phase: u64,
}

impl Pair<'_> {
    /// Waits for the other process at the next phase; false when it never came.
    fn sync(&mut self) -> bool {
        self.phase += 1;
        barrier(self.shared, self.me, self.phase)
    }
}

/// Meets the other process of a pair (words 0..4 of `shared`: the pids, then the barrier
/// counters) and lets it read this process's memory.
fn meet(shared: &Shared, me: usize) -> Option<Pair<'_>> {
    // SAFETY: getpid has no preconditions.
    shared.word(me).store(unsafe { libc::getpid() } as u64, Ordering::Release);
    if !barrier(shared, me, 1) {
        return None;
    }
    if me == 0 {
        // The child reads the parent: allow it where Yama restricts ptrace to ancestors.
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_PTRACER, shared.word(1).load(Ordering::Acquire) as libc::c_ulong) };
    }
    let peer = shared.word(1 - me).load(Ordering::Acquire) as libc::pid_t;
    barrier(shared, me, 2).then_some(Pair { shared, me, peer, phase: 2 })
}

/// Reads `len` bytes at `remote` in process `peer` into `local` with process_vm_readv; false
/// (reported) when it did not read them all.
///
/// # Safety
/// `local` must be writable for `len` bytes.
unsafe fn read_peer(peer: libc::pid_t, remote: usize, local: *mut u8, len: usize) -> bool {
    let local = libc::iovec { iov_base: local.cast(), iov_len: len };
    let remote = libc::iovec { iov_base: remote as *mut libc::c_void, iov_len: len };
    // SAFETY: `local` per the caller; the kernel checks `remote` in the peer.
    if unsafe { libc::process_vm_readv(peer, &local, 1, &remote, 1, 0) } != len as isize {
        eprintln!("process_vm_readv: {}", std::io::Error::last_os_error());
        return false;
    }
    true
}

/// Runs `body(index)` in `n` processes (this one is index 0, the others forked children) and
/// returns whether every child exited with status 0.
fn in_processes(n: usize, body: impl Fn(usize) -> bool) -> bool {
    let mut children = Vec::new();
    for i in 1..n {
        // SAFETY: the bench is single-threaded here; the child only runs `body` and exits.
        match unsafe { libc::fork() } {
            0 => {
                let ok = body(i);
                // SAFETY: ends the child without running the parent's destructors twice.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            pid if pid > 0 => children.push(pid),
            _ => {
                eprintln!("fork failed: {}", std::io::Error::last_os_error());
                return false;
            }
        }
    }
    let mut ok = body(0);
    for pid in children {
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        ok &= libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    }
    ok
}

/// Seconds per round of the post-and-wait protocol among `n` processes, median of 5 repetitions
/// of `rounds` rounds; None when a process gave up.
fn post_and_wait(n: usize, rounds: u64) -> Option<f64> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let oversubscribed = n > cores;
    // Lines 0..n: each process's sequence word; line n: per-repetition seconds (f64 bits) from
    // process 0.
    let shared = Shared::new(n + 1 + 5);
    let ok = in_processes(n, |me| {
        let mut k = 0u64;
        for rep in 0..5 {
            let start = Instant::now();
            for _ in 0..rounds {
                k += 1;
                shared.word(me).store(k, Ordering::Release);
                for r in 0..n {
                    if !wait_for(|| shared.word(r).load(Ordering::Acquire) >= k, oversubscribed) {
                        return false;
                    }
                }
            }
            if me == 0 {
                shared.word(n + 1 + rep).store(start.elapsed().as_secs_f64().to_bits(), Ordering::Relaxed);
            }
        }
        true
    });
    let mut per_round: Vec<f64> =
        (0..5).map(|rep| f64::from_bits(shared.word(n + 1 + rep).load(Ordering::Relaxed)) / rounds as f64).collect();
    ok.then(|| percentile(&mut per_round, 50.0))
}

/// GB/s per process of two processes each reading the other's `bytes` (process_vm_readv, in
/// PIECE pieces into a cached scratch buffer) at once, and of the same two copying their own
/// buffer with memcpy at once; medians of 5 rounds. None when a read failed (not permitted).
fn cross_process_read(bytes: usize) -> Option<(f64, f64)> {
    // Words: 0..2 the pids, 2..4 barrier counters, 4..24 per-process per-round seconds.
    let shared = Shared::new(24);
    // Allocated before the fork, so both processes have their own copy at the same address
    // (written below, which makes the pages private to each).
    let mut buf = vec![0u8; bytes];
    let buf_addr = buf.as_mut_ptr() as usize;
    let ok = in_processes(2, |me| {
        // SAFETY: `buf` is this process's own copy; written whole to make its pages private.
        let own = unsafe { std::slice::from_raw_parts_mut(buf_addr as *mut u8, bytes) };
        own.fill(me as u8 + 1);
        let mut copy = vec![0u8; bytes];
        copy.fill(1);
        let mut scratch = vec![0u8; PIECE];
        let Some(mut pair) = meet(&shared, me) else { return false };
        for round in 0..5 {
            if !pair.sync() {
                return false;
            }
            let start = Instant::now();
            for off in (0..bytes).step_by(PIECE) {
                let len = PIECE.min(bytes - off);
                // SAFETY: the peer's buffer (same address, its own copy) into our scratch
                // buffer of at least `len` bytes.
                if !unsafe { read_peer(pair.peer, buf_addr + off, scratch.as_mut_ptr(), len) } {
                    return false;
                }
            }
            let read = start.elapsed().as_secs_f64();
            if !pair.sync() {
                return false;
            }
            let start = Instant::now();
            copy.copy_from_slice(std::hint::black_box(&*own));
            let copied = start.elapsed().as_secs_f64();
            std::hint::black_box(&copy);
            shared.word(4 + me * 10 + round).store(read.to_bits(), Ordering::Relaxed);
            shared.word(4 + me * 10 + 5 + round).store(copied.to_bits(), Ordering::Relaxed);
        }
        // The last piece read holds the peer's bytes, not ours.
        scratch[0] == 2 - me as u8
    });
    drop(buf);
    let rate = |first: usize| {
        let mut v: Vec<f64> = (0..2)
            .flat_map(|me| (0..5).map(move |r| 4 + me * 10 + first + r))
            .map(|w| bytes as f64 / f64::from_bits(shared.word(w).load(Ordering::Relaxed)) / 1e9)
            .collect();
        percentile(&mut v, 50.0)
    };
    ok.then(|| (rate(0), rate(5)))
}

/// busbw in GB/s (median of 5 rounds) of a 2-process fp32 sum allreduce of two private
/// `bytes` heap buffers by hccn's single-copy scheme, written out without any library: each
/// process reads its half of the peer's input with process_vm_readv, in PIECE pieces, into its
/// output and adds its own input there while the piece is in cache; then, after a barrier, it
/// reads the peer's reduced half into its output. None when a read failed or a sum was wrong.
fn heap_allreduce(bytes: usize) -> Option<f64> {
    // Words: 0..2 the pids, 2..4 barrier counters, 4..9 process 0's per-round seconds.
    let shared = Shared::new(9);
    let floats = bytes / 4;
    // Allocated before the fork, so both processes have their own copies at the same addresses.
    let mut input = vec![0f32; floats];
    let mut output = vec![0f32; floats];
    let (in_addr, out_addr) = (input.as_mut_ptr() as usize, output.as_mut_ptr() as usize);
    let ok = in_processes(2, |me| {
        // SAFETY: this process's own copies of the two buffers, written whole to make their
        // pages private.
        let (own_in, out) = unsafe {
            (
                std::slice::from_raw_parts_mut(in_addr as *mut f32, floats),
                std::slice::from_raw_parts_mut(out_addr as *mut f32, floats),
            )
        };
        own_in.fill(me as f32 + 1.0);
        out.fill(0.0);
        let Some(mut pair) = meet(&shared, me) else { return false };
        let peer = pair.peer;
        // Reads floats `range` of the peer's buffer at `from` into ours at `to`, piece by piece,
        // calling `then` on each piece as it lands.
        let read = |from: usize, to: usize, range: std::ops::Range<usize>, then: &mut dyn FnMut(usize, usize)| {
            for off in (range.start * 4..range.end * 4).step_by(PIECE) {
                let len = PIECE.min(range.end * 4 - off);
                // SAFETY: `len` bytes inside the peer's buffer (same address, its own copy)
                // into the same bytes of ours.
                if !unsafe { read_peer(peer, from + off, (to + off) as *mut u8, len) } {
                    return false;
                }
                then(off / 4, (off + len) / 4);
            }
            true
        };
        let half = floats / 2;
        let (mine, theirs) = if me == 0 { (0..half, half..floats) } else { (half..floats, 0..half) };
        for round in 0..5 {
            if !pair.sync() {
                return false;
            }
            let start = Instant::now();
            let reduced = read(in_addr, out_addr, mine.clone(), &mut |a, b| {
                // SAFETY: floats a..b of our output, just written by the read, and of our input.
                let (dst, src) = unsafe {
                    (
                        std::slice::from_raw_parts_mut((out_addr as *mut f32).add(a), b - a),
                        std::slice::from_raw_parts((in_addr as *const f32).add(a), b - a),
                    )
                };
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += *s);
            });
            if !reduced || !pair.sync() || !read(out_addr, out_addr, theirs.clone(), &mut |_, _| {}) || !pair.sync() {
                return false;
            }
            if me == 0 {
                shared.word(4 + round).store(start.elapsed().as_secs_f64().to_bits(), Ordering::Relaxed);
            }
        }
        // SAFETY: as above.
        let out = unsafe { std::slice::from_raw_parts(out_addr as *const f32, floats) };
        out.iter().all(|&v| v == 3.0)
    });
    drop((input, output));
    let mut busbw: Vec<f64> =
        (0..5).map(|r| bytes as f64 / f64::from_bits(shared.word(4 + r).load(Ordering::Relaxed)) / 1e9).collect();
    ok.then(|| percentile(&mut busbw, 50.0))
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let bytes = if quick { 16 << 20 } else { 64 << 20 };
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    println!("# hccn-limits: this machine's floors, measured without hccn ({cores} cores)");
    match cross_process_read(bytes) {
        Some((cma, memcpy)) => println!(
            "cross-process read {} MiB, 2 processes at once: {cma:.2} GB/s each (memcpy of their own buffers at once: {memcpy:.2} GB/s each)",
            bytes >> 20
        ),
        None => println!("cross-process read {} MiB: failed (process_vm_readv not permitted?)", bytes >> 20),
    }
    match heap_allreduce(bytes) {
        Some(busbw) => println!(
            "allreduce {} MiB of heap buffers, 2 processes, single-copy scheme without a library: {busbw:.2} GB/s busbw",
            bytes >> 20
        ),
        None => println!("allreduce {} MiB of heap buffers: failed", bytes >> 20),
    }
    let scale = if quick { 10 } else { 1 };
    for (n, rounds) in [(2usize, 200_000u64), (4, 50_000)] {
        let how = if n > cores { "yielding" } else { "spinning" };
        match post_and_wait(n, rounds / scale) {
            Some(s) => println!("post and wait, {n} processes ({how}): {:.2} us per round", s * 1e6),
            None => println!("post and wait, {n} processes: failed (a process waited over {} s)", GIVE_UP.as_secs()),
        }
    }
}
