//! The matrix with every rank a thread of this process, through the runtime directly (real
//! sockets, real store). Fast to run and to debug; the C ABI pass runs real processes.

use std::time::Duration;

use hccn_runtime::{Config, DataType};
use hccn_tests::matrix;
use hccn_tests::threads::world;

fn config() -> Config {
    Config { chunk_bytes: 4096, timeout: Duration::from_secs(60), ..Config::default() }
}

#[test]
fn matrix_on_threads_world_sizes_1_to_5() {
    let dtypes = [DataType::Int8, DataType::Fp16, DataType::Fp32, DataType::Uint64, DataType::Bf16];
    for n in 1..=5u32 {
        let comms = world(n, &config());
        let reports: Vec<_> = comms
            .into_iter()
            .map(|c| std::thread::spawn(move || matrix::run(&c, &dtypes, &[0, 1, 7, 1023, 4099])))
            .collect();
        for h in reports {
            let rep = h.join().expect("rank thread");
            assert!(
                rep.failures.is_empty(),
                "world {n}: {} failures, first: {:#?}",
                rep.failures.len(),
                &rep.failures[..rep.failures.len().min(10)]
            );
            assert!(rep.checks > 0);
        }
    }
}

/// Each allreduce algorithm forced in turn (as HCCN_ALGO does) over world sizes that cover the
/// power-of-two and the folded (non-power-of-two) cases of recursive halving-doubling.
#[test]
fn matrix_with_each_algorithm_forced() {
    use hccn_runtime::tuning::AlgoChoice;
    let dtypes = [DataType::Int8, DataType::Fp16, DataType::Fp32, DataType::Int64];
    for algo in [AlgoChoice::Ring, AlgoChoice::Rhd, AlgoChoice::Tree] {
        for n in [2u32, 3, 4, 6, 7] {
            let comms = world(n, &Config { algo, ..config() });
            let reports: Vec<_> = comms
                .into_iter()
                .map(|c| std::thread::spawn(move || matrix::run(&c, &dtypes, &[0, 1, 7, 1023, 4099])))
                .collect();
            for h in reports {
                let rep = h.join().expect("rank thread");
                assert!(
                    rep.failures.is_empty(),
                    "{} on world {n}: {} failures, first: {:#?}",
                    algo.name(),
                    rep.failures.len(),
                    &rep.failures[..rep.failures.len().min(10)]
                );
            }
        }
    }
}

/// With the default (large) chunk the model picks chunks per operation; an allgatherv whose
/// blocks differ by megabytes must still be cut the same way by sender and receiver.
#[test]
fn allgatherv_with_unequal_large_blocks_and_default_chunks() {
    use hccn_runtime::{Op, Ptr};
    let counts: Vec<u64> = vec![3 << 20, 2, 1 << 20];
    let displs: Vec<u64> = counts.iter().scan(0, |acc, c| Some(std::mem::replace(acc, *acc + c))).collect();
    let total: u64 = counts.iter().sum();
    let comms = world(3, &Config { timeout: Duration::from_secs(60), ..Config::default() });
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let (counts, displs) = (counts.clone(), displs.clone());
            std::thread::spawn(move || {
                let r = c.rank() as usize;
                let send: Vec<u8> = (0..counts[r]).map(|i| (i as u8).wrapping_mul(7).wrapping_add(r as u8)).collect();
                let mut recv = vec![0u8; total as usize];
                let op = Op::AllGatherV {
                    send: Ptr::from_const(send.as_ptr()),
                    send_count: counts[r],
                    recv: Ptr::from_mut(recv.as_mut_ptr()),
                    recv_counts: counts.clone(),
                    displs: displs.clone(),
                    dt: DataType::Uint8,
                };
                // SAFETY: both buffers live until the blocking call returns.
                unsafe { c.submit(op, None) }.expect("allgatherv");
                for (q, (&n, &d)) in counts.iter().zip(&displs).enumerate() {
                    let want = (0..n).map(|i| (i as u8).wrapping_mul(7).wrapping_add(q as u8));
                    assert!(recv[d as usize..(d + n) as usize].iter().copied().eq(want), "rank {r}: block {q}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("rank thread");
    }
}

#[test]
fn hier_without_hosts_is_a_clear_error() {
    use hccn_runtime::tuning::AlgoChoice;
    use hccn_runtime::ErrorKind;
    let comms = world(2, &Config { algo: AlgoChoice::Hier, ..config() });
    let errs: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let mut out = [0f32; 4];
                c.all_reduce(&[1f32; 4], &mut out, hccn_runtime::ReduceOp::Sum).err()
            })
        })
        .collect();
    for h in errs {
        let e = h.join().expect("rank thread").expect("hier cannot run on one host");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("HCCN_ALGO=hier"), "{e}");
    }
}

#[test]
fn abort_wakes_an_operation_blocked_on_a_stream() {
    use hccn_runtime::{ErrorKind, Op, Ptr, Stream};
    let comms = world(2, &Config { timeout: Duration::from_secs(60), ..Config::default() });
    let stream = Stream::new().expect("stream");
    let mut buf = vec![0u8; 64];
    // Rank 1 never sends, so this receive can only end by the abort.
    let op = Op::Recv { buf: Ptr::from_mut(buf.as_mut_ptr()), count: 64, dt: hccn_runtime::DataType::Uint8, peer: 1 };
    // SAFETY: `buf` outlives the stream's work (synchronized below).
    unsafe { comms[0].submit(op, Some(&stream)) }.expect("enqueue");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(stream.query().ok(), Some(false), "the receive should still be pending");
    let t = std::time::Instant::now();
    comms[0].abort();
    let e = stream.synchronize().err().map(|e| e.kind());
    assert_eq!(e, Some(ErrorKind::Aborted));
    assert!(t.elapsed() < Duration::from_secs(2), "abort took {:?}", t.elapsed());
    // Later operations fail at once too, and the error is sticky on the stream.
    // SAFETY: a barrier has no buffers.
    let later = unsafe { comms[0].submit(Op::Barrier, None) }.err().map(|e| e.kind());
    assert_eq!(later, Some(ErrorKind::Aborted));
}

#[test]
fn chunk_sizes_that_split_elements_still_reduce_exactly() {
    // 4097 is a valid HCCN_CHUNK_BYTES but not a multiple of any element size above 1.
    let cfg = Config { chunk_bytes: 4097, ..config() };
    let dtypes = [DataType::Fp32, DataType::Int64, DataType::Bf16];
    let comms = world(3, &cfg);
    let reports: Vec<_> =
        comms.into_iter().map(|c| std::thread::spawn(move || matrix::run(&c, &dtypes, &[4099]))).collect();
    for h in reports {
        let rep = h.join().expect("rank thread");
        assert!(rep.failures.is_empty(), "{:#?}", &rep.failures[..rep.failures.len().min(10)]);
    }
}

#[test]
fn bucket_flushes_when_full_and_reduces_oversized_tensors_alone() {
    use hccn_runtime::{Bucket, Ptr, ReduceOp};
    let comm = world(1, &config()).remove(0);
    // 25 FP32 elements per fused allreduce.
    let mut b = Bucket::new(comm, 100, DataType::Fp32, ReduceOp::Sum).expect("bucket");
    let mut bufs: Vec<Vec<f32>> = [10, 10, 10, 15, 0, 30, 5].iter().map(|&n| vec![1.5; n]).collect();
    // Collectives launched after each add: the third add flushes the first two, the fourth fills
    // the bucket (flush), count 0 does nothing, 30 elements are more than the bucket holds.
    let want = [0, 0, 1, 2, 2, 3, 3];
    for (i, buf) in bufs.iter_mut().enumerate() {
        // SAFETY: every buffer lives, untouched, until the flush below returns (no stream).
        unsafe { b.add(Ptr::from_mut(buf.as_mut_ptr()), buf.len() as u64, None) }.expect("add");
        assert_eq!(b.collectives(), want[i], "after add {i}");
    }
    b.flush(None).expect("flush");
    b.flush(None).expect("flush with nothing pending");
    assert_eq!(b.collectives(), 4);
    assert!(bufs.iter().all(|v| v.iter().all(|x| *x == 1.5)), "a world of one reduces to the input");
}

/// Every small collective of a one-host communicator goes to the shared-memory board (default
/// HCCN_BOARD_BYTES), and none with HCCN_BOARD_BYTES=0: the whole matrix (dtypes, ops, counts
/// 0/1/7/odd, every root, in place) through both paths, up to 8 ranks.
#[test]
fn matrix_with_the_board_on_and_off() {
    let dtypes = [DataType::Int8, DataType::Fp16, DataType::Fp32, DataType::Int64];
    let colls = ["allreduce", "reduce", "broadcast", "allgather", "gather", "reduce_scatter", "scatter", "alltoall"];
    for (n, board_bytes) in [(6u32, 4096usize), (7, 4096), (8, 4096), (2, 0), (3, 0), (4, 0)] {
        let comms = world(n, &Config { board_bytes, ..config() });
        for op in colls.iter().chain(&["barrier"]) {
            let algo = comms[0].plan(op, 64 * n as usize).ok().flatten().map(|p| p.0);
            assert_eq!(
                algo == Some("board"),
                board_bytes > 0,
                "{op} on {n} ranks, board bytes {board_bytes}: {algo:?}"
            );
        }
        let reports: Vec<_> =
            comms.into_iter().map(|c| std::thread::spawn(move || matrix::run(&c, &dtypes, &[0, 1, 7, 129]))).collect();
        for h in reports {
            let rep = h.join().expect("rank thread");
            assert!(
                rep.failures.is_empty(),
                "world {n}, board bytes {board_bytes}: {} failures, first: {:#?}",
                rep.failures.len(),
                &rep.failures[..rep.failures.len().min(10)]
            );
        }
    }
}

/// Small allreduces take the shared-memory board, each in its turn: here many at once on three
/// streams per rank (more in flight than the board has slots per rank), mixed with larger ones
/// that take messages, and every result must be exact on every rank.
#[test]
fn small_allreduces_on_many_streams_share_the_board_in_turn() {
    use hccn_runtime::{Op, Ptr, ReduceOp, Stream};
    let n = 4u32;
    let comms = world(n, &config());
    assert_eq!(comms[0].plan("allreduce", 64).ok().flatten().map(|p| p.0), Some("board"));
    assert_ne!(comms[0].plan("allreduce", 64 << 10).ok().flatten().map(|p| p.0), Some("board"));
    let ops = 60usize;
    // Op i: 3 + i%5 int64 elements, or 1500 (12 KB, past the board) every fourth op.
    let len = |i: usize| if i % 4 == 3 { 1500 } else { 3 + i % 5 };
    let ranks: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(r, comm)| {
            std::thread::spawn(move || {
                let streams: Vec<Stream> = (0..3).map(|_| Stream::new().expect("stream")).collect();
                let mut bufs: Vec<Vec<i64>> =
                    (0..ops).map(|i| (0..len(i)).map(|k| (r * 1000 + i * 10 + k) as i64).collect()).collect();
                for (i, b) in bufs.iter_mut().enumerate() {
                    let p = Ptr::from_mut(b.as_mut_ptr());
                    let op = Op::AllReduce {
                        send: p,
                        recv: p,
                        count: b.len() as u64,
                        dt: DataType::Int64,
                        op: ReduceOp::Sum,
                    };
                    // SAFETY: every buffer outlives its stream's work (synchronized below).
                    unsafe { comm.submit(op, Some(&streams[i % 3])) }.expect("enqueue");
                }
                let errs: Vec<String> =
                    streams.iter().filter_map(|s| s.synchronize().err()).map(|e| format!("rank {r}: {e}")).collect();
                assert!(errs.is_empty(), "{errs:#?}");
                bufs
            })
        })
        .collect();
    for h in ranks {
        let bufs = h.join().expect("rank thread");
        for (i, b) in bufs.iter().enumerate() {
            let want: Vec<i64> =
                (0..len(i)).map(|k| (0..n as usize).map(|r| (r * 1000 + i * 10 + k) as i64).sum()).collect();
            assert_eq!(b, &want, "op {i}");
        }
    }
}
