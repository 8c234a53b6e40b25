//! Fuzz target: random calls through the C ABI against a live single-rank communicator. Handles
//! are the live one, NULL, forged integers or destroyed ones; enums and counts are random;
//! buffers are NULL or real (never smaller than what the call may touch, which the caller
//! promises by contract). Every call must return a known result code and never
//! `HCCN_ERROR_INTERNAL` (a panic caught at the boundary); single-rank results are checked.
#![no_main]

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

use hccn::*;

const BUF: usize = 1 << 14;
const INTERNAL: u32 = 4;
const KNOWN: &[u32] = &[0, 1, 2, 3, 5, 6, 7, 8, 9, 11, 13, 15, 21, 100, 101, 102, 103, 104, 105, 106];

struct Live {
    comm: usize,
    dead_comm: usize,
    dead_stream: usize,
}

fn live() -> &'static Live {
    static LIVE: OnceLock<Live> = OnceLock::new();
    LIVE.get_or_init(|| {
        let mut id = hccn_unique_id { internal: [0; 128] };
        let mut comm = null_mut();
        let mut dead = null_mut();
        let mut stream = null_mut();
        // SAFETY: valid output pointers; one rank joins its own id.
        unsafe {
            assert_eq!(hccn_get_unique_id(&mut id), 0);
            assert_eq!(hccn_comm_init_rank(&mut comm, 1, &id, 0), 0);
            let mut id2 = hccn_unique_id { internal: [0; 128] };
            assert_eq!(hccn_get_unique_id(&mut id2), 0);
            assert_eq!(hccn_comm_init_rank(&mut dead, 1, &id2, 0), 0);
            assert_eq!(hccn_comm_destroy(dead), 0);
            assert_eq!(hccn_stream_create(&mut stream), 0);
            assert_eq!(hccn_stream_destroy(stream), 0);
        }
        Live { comm: comm as usize, dead_comm: dead as usize, dead_stream: stream as usize }
    })
}

/// Reads the fuzzer's bytes as choices; zeros once they run out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    /// A data type: mostly valid, sometimes any u32.
    fn dtype(&mut self) -> u32 {
        match self.u8() % 8 {
            0 => self.u32(),
            _ => u32::from(self.u8() % 12),
        }
    }
    fn op(&mut self) -> u32 {
        match self.u8() % 8 {
            0 => self.u32(),
            _ => u32::from(self.u8() % 5),
        }
    }
    fn comm(&mut self, l: &Live) -> *mut hccn_comm {
        match self.u8() % 8 {
            0 => null_mut(),
            1 => self.u64() as usize as *mut hccn_comm,
            2 => l.dead_comm as *mut hccn_comm,
            _ => l.comm as *mut hccn_comm,
        }
    }
    fn stream(&mut self, mine: *mut hccn_stream, l: &Live) -> *mut hccn_stream {
        match self.u8() % 8 {
            0 => self.u64() as usize as *mut hccn_stream,
            1 => l.dead_stream as *mut hccn_stream,
            2 | 3 => mine,
            _ => null_mut(),
        }
    }
    /// A count that, for a valid `dt`, keeps `count * factor` elements inside a buffer; for an
    /// invalid data type any count (the call must refuse the type before touching memory).
    fn count(&mut self, dt: u32, factor: usize) -> u64 {
        let raw = self.u64();
        if dt >= 12 {
            return raw;
        }
        // Elements are at most 8 bytes.
        raw % ((BUF / 8 / factor) as u64 + 1)
    }
    fn rank(&mut self) -> u32 {
        match self.u8() % 4 {
            0 => self.u32(),
            _ => 0,
        }
    }
}

fn checked(rc: u32, what: &str) -> u32 {
    assert!(KNOWN.contains(&rc), "{what}: unknown result code {rc}");
    if rc == INTERNAL {
        // SAFETY: the library returns a NUL-terminated static or thread-local string.
        let msg = unsafe { std::ffi::CStr::from_ptr(hccn_get_last_error()) };
        panic!("{what}: HCCN_ERROR_INTERNAL: {}", msg.to_string_lossy());
    }
    rc
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let l = live();
    let mut inp = Input(data);
    let mut send = vec![0u8; BUF];
    let mut recv = vec![0u8; BUF];
    for (i, b) in send.iter_mut().enumerate() {
        *b = (i % 3) as u8;
    }
    let mut mine: *mut hccn_stream = null_mut();
    // SAFETY: valid output pointer.
    checked(unsafe { hccn_stream_create(&mut mine) }, "stream_create");
    let mut calls = 0;
    while !inp.0.is_empty() && calls < 16 {
        calls += 1;
        let which = inp.u8() % 20;
        let sp: *const c_void = if inp.u8() % 8 == 0 { null() } else { send.as_ptr().cast() };
        let rp: *mut c_void = if inp.u8() % 8 == 0 { null_mut() } else { recv.as_mut_ptr().cast() };
        let dt = inp.dtype();
        let op = inp.op();
        let comm = inp.comm(l);
        let stream = inp.stream(mine, l);
        let valid = comm as usize == l.comm && dt < 12 && op < 5 && !sp.is_null() && !rp.is_null();
        // SAFETY: every buffer is NULL or BUF bytes, and counts keep valid calls inside it;
        // handles are checked against the library's tables before any use.
        let rc = unsafe {
            match which {
                0 => {
                    let n = inp.count(dt, 1);
                    let rc = checked(hccn_allreduce(sp, rp, n, dt, op, comm, stream), "allreduce");
                    if rc == 0 && stream.is_null() && valid {
                        // One rank: the result is the input, except AVG/PROD of one value too.
                        let bytes = (n as usize) * DataTypeSize::of(dt);
                        assert_eq!(recv[..bytes], send[..bytes], "allreduce of one rank changed data");
                    }
                    rc
                }
                1 => {
                    let wire = inp.dtype();
                    let n = inp.count(dt, 1);
                    hccn_allreduce_compressed(sp, rp, n, dt, wire, op, comm, stream)
                }
                2 => hccn_broadcast(rp, inp.count(dt, 1), dt, inp.rank(), comm, stream),
                3 => hccn_reduce(sp, rp, inp.count(dt, 1), dt, op, inp.rank(), comm, stream),
                4 => hccn_allgather(sp, rp, inp.count(dt, 1), dt, comm, stream),
                5 => hccn_reduce_scatter(sp, rp, inp.count(dt, 1), dt, op, comm, stream),
                6 => hccn_gather(sp, rp, inp.count(dt, 1), dt, inp.rank(), comm, stream),
                7 => hccn_scatter(sp, rp, inp.count(dt, 1), dt, inp.rank(), comm, stream),
                8 => hccn_alltoall(sp, rp, inp.count(dt, 1), dt, comm, stream),
                9 => {
                    let n = inp.count(dt, 2);
                    let counts = [n];
                    let displs = [inp.count(dt, 2)];
                    let cp = if inp.u8() % 8 == 0 { null() } else { counts.as_ptr() };
                    let dp = if inp.u8() % 8 == 0 { null() } else { displs.as_ptr() };
                    hccn_allgatherv(sp, n, rp, cp, dp, dt, comm, stream)
                }
                10 => {
                    let sc = [inp.count(dt, 2)];
                    let sd = [inp.count(dt, 2)];
                    let rc_ = [inp.count(dt, 2)];
                    let rd = [inp.count(dt, 2)];
                    hccn_alltoallv(sp, sc.as_ptr(), sd.as_ptr(), rp, rc_.as_ptr(), rd.as_ptr(), dt, comm, stream)
                }
                // A single rank has no peer: any peer but itself must be refused at once.
                11 => hccn_send(sp, inp.count(dt, 1), dt, inp.u32() | 1, comm, stream),
                12 => hccn_recv(rp, inp.count(dt, 1), dt, inp.u32() | 1, comm, stream),
                13 => hccn_barrier(comm, stream),
                14 => {
                    let mut r = 7u32;
                    let out = if inp.u8() % 4 == 0 { null_mut() } else { &mut r as *mut u32 };
                    let rc = checked(hccn_comm_rank(comm, out), "comm_rank");
                    let mut s = 7u32;
                    let out = if inp.u8() % 4 == 0 { null_mut() } else { &mut s as *mut u32 };
                    let rc2 = checked(hccn_comm_size(comm, out), "comm_size");
                    if rc == 0 {
                        assert_eq!(r, 0);
                    }
                    if rc2 == 0 {
                        assert_eq!(s, 1);
                    }
                    rc
                }
                15 => {
                    let mut ranks = [0u32; 4];
                    let cap = inp.u32() % 5;
                    let mut count = 0u32;
                    let rp_ = if inp.u8() % 4 == 0 { null_mut() } else { ranks.as_mut_ptr() };
                    let cnt = if inp.u8() % 4 == 0 { null_mut() } else { &mut count as *mut u32 };
                    let rc = checked(hccn_comm_failed_ranks(comm, rp_, cap, cnt), "failed_ranks");
                    let mut e = 0u64;
                    checked(hccn_comm_epoch(comm, &mut e), "epoch");
                    let mut ae = 0u32;
                    checked(hccn_comm_get_async_error(comm, &mut ae), "async_error");
                    rc
                }
                16 => {
                    let mut ev = null_mut();
                    checked(hccn_event_create(&mut ev), "event_create");
                    checked(hccn_event_record(ev, stream), "event_record");
                    checked(hccn_event_query(ev), "event_query");
                    checked(hccn_event_synchronize(ev), "event_synchronize");
                    checked(hccn_event_destroy(ev), "event_destroy");
                    // A destroyed event is refused, not used.
                    let again = checked(hccn_event_query(ev), "event_query after destroy");
                    assert_ne!(again, 0, "a destroyed event was accepted");
                    0
                }
                17 => {
                    let cap = inp.u64() % (BUF as u64 * 2);
                    let mut b = null_mut();
                    let rc = checked(hccn_bucket_create(comm, cap, dt, op, &mut b), "bucket_create");
                    if rc == 0 {
                        let n = inp.count(dt, 1);
                        let add = checked(hccn_bucket_add(b, rp, n, stream), "bucket_add");
                        let _ = add;
                        checked(hccn_bucket_flush(b, stream), "bucket_flush");
                        if !stream.is_null() {
                            let _ = hccn_stream_synchronize(stream);
                        }
                        checked(hccn_bucket_destroy(b), "bucket_destroy");
                    }
                    rc
                }
                18 => {
                    let code = inp.u32();
                    let s = hccn_get_error_string(code);
                    assert!(!s.is_null());
                    let _ = std::ffi::CStr::from_ptr(s);
                    let mut v = 0i32;
                    checked(hccn_get_version(&mut v), "version");
                    checked(hccn_get_version(null_mut()), "version(NULL)")
                }
                _ => {
                    // Forged handles given to the destroy functions must be refused, not freed.
                    let forged = inp.u64() as usize;
                    if forged != l.comm && forged != 0 {
                        let rc = checked(hccn_comm_destroy(forged as *mut hccn_comm), "comm_destroy(forged)");
                        assert_ne!(rc, 0, "a forged communicator was destroyed");
                    }
                    if forged != mine as usize && forged != 0 {
                        let rc = checked(hccn_stream_destroy(forged as *mut hccn_stream), "stream_destroy(forged)");
                        assert_ne!(rc, 0, "a forged stream was destroyed");
                    }
                    checked(hccn_stream_query(stream), "stream_query")
                }
            }
        };
        checked(rc, "call");
        if !stream.is_null() {
            // SAFETY: any handle; forged ones are refused.
            let _ = unsafe { hccn_stream_synchronize(stream) };
        }
    }
    // SAFETY: our own live stream; waits for its queued work before the buffers go.
    checked(unsafe { hccn_stream_destroy(mine) }, "stream_destroy");
});

/// Element sizes of the C ABI's data types, from the runtime's own table.
struct DataTypeSize;

impl DataTypeSize {
    fn of(dt: u32) -> usize {
        hccn_runtime::DataType::from_raw(dt).map(|d| d.size()).unwrap_or(1)
    }
}
