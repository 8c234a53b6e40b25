//! The matrix with every rank a thread of this process, through the runtime directly (real
//! sockets, real store). Fast to run and to debug; the C ABI pass runs real processes.

use std::time::Duration;

use hccn_runtime::{new_unique_id, Communicator, Config, DataType};
use hccn_tests::matrix;

fn world(n: u32, cfg: &Config) -> Vec<Communicator> {
    let id = new_unique_id(cfg).expect("unique id");
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let (id, cfg) = (id.clone(), cfg.clone());
            std::thread::spawn(move || Communicator::init_rank(&id, n, r, &cfg).expect("init_rank"))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("join")).collect()
}

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
