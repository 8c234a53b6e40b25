//! Rooted collectives cannot run away: a loop of reduces whose root is slow, or of broadcasts
//! whose receivers are slow, keeps what waits in inboxes bounded (collectives/runahead.rs)
//! instead of queueing every early frame. Ranks are threads of this process over TCP, where each
//! link's reader thread takes what arrives off the socket; a counting allocator sees the live
//! bytes of all of them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hccn_runtime::config::Transport;
use hccn_runtime::{Communicator, Config, DataType, Op, Ptr, ReduceOp};
use hccn_tests::threads::world;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is passed on to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: as the caller's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: as the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        grew(new_size);
        // SAFETY: as the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const RANKS: u32 = 4;
const OPS: usize = 300;
const BYTES: usize = 1 << 20;
/// Without the bound the early frames of 300 operations of 1 MiB would reach hundreds of MiB.
const BOUND: usize = 128 << 20;

/// Runs `OPS` rooted operations of 1 MiB (`op(rank, buffers)`) on 4 ranks over TCP, the ranks
/// for which `slow(rank)` holds pausing 2 ms before each; returns the peak growth of live bytes.
fn peak_growth(make: fn(Ptr, Ptr) -> Op, slow: fn(u32) -> bool) -> usize {
    let cfg = Config {
        transport: Transport::Tcp,
        heartbeat: Duration::ZERO,
        timeout: Duration::from_secs(120),
        ..Config::default()
    };
    let comms = world(RANKS, &cfg);
    let bufs: Vec<(Vec<f32>, Vec<f32>)> = (0..RANKS).map(|_| (vec![1.0; BYTES / 4], vec![0.0; BYTES / 4])).collect();
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let ranks: Vec<_> = comms
        .into_iter()
        .zip(bufs)
        .map(|(c, (send, mut recv)): (Communicator, _)| {
            std::thread::spawn(move || {
                let (s, r) = (Ptr::from_const(send.as_ptr()), Ptr::from_mut(recv.as_mut_ptr()));
                for i in 0..OPS {
                    if slow(c.rank()) {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    // SAFETY: both buffers live in this thread until the blocking call returns
                    // and hold the operation's 1 MiB.
                    if let Err(e) = unsafe { c.submit(make(s, r), None) } {
                        panic!("rank {}: operation {i}: {e}", c.rank());
                    }
                }
                drop(recv);
                c
            })
        })
        .collect();
    let comms: Vec<_> = ranks.into_iter().map(|h| h.join().expect("rank thread")).collect();
    drop(comms);
    PEAK.load(Ordering::SeqCst) - base
}

const COUNT: u64 = (BYTES / 4) as u64;

#[test]
fn senders_of_rooted_operations_stay_within_a_bounded_lead() {
    let reduce = |s, r| Op::Reduce { send: s, recv: r, count: COUNT, dt: DataType::Fp32, op: ReduceOp::Sum, root: 0 };
    let grown = peak_growth(reduce, |rank| rank == 0);
    eprintln!("reduce, slow root: live bytes grew by {} MiB at most", grown >> 20);
    assert!(grown < BOUND, "reduce with a slow root: {} MiB waiting", grown >> 20);

    let broadcast = |_, r| Op::Broadcast { buf: r, count: COUNT, dt: DataType::Fp32, root: 0 };
    let grown = peak_growth(broadcast, |rank| rank != 0);
    eprintln!("broadcast, slow receivers: live bytes grew by {} MiB at most", grown >> 20);
    assert!(grown < BOUND, "broadcast with slow receivers: {} MiB waiting", grown >> 20);
}
