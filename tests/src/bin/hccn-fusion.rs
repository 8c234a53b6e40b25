//! Fusion buckets through the C ABI in one rank of a job started by hccnrun: many tensors of mixed
//! sizes (count 0, one exactly filling the bucket, one larger than it) for FP32 SUM and INT32
//! MAX, without and with a stream; each result must equal the exact reduction and the unfused
//! allreduce of the same tensor. Then stream ordering, destroy without flush, and bad input.
//! Usage: hccnrun -n N hccn-fusion [--scale K]; `--scale K` multiplies the bucket capacity and
//! every tensor's size by K (fused buffers then go by descriptor between same-host ranks, read
//! in place from the bucket's shareable staging memory).

use std::ffi::c_void;
use std::process::ExitCode;
use std::ptr::{null_mut, NonNull};

use hccn::*;
use hccn_runtime::{DataType, ReduceOp};
use hccn_tests::capi::{check, expect_refusal, CComm};
use hccn_tests::Coll;

/// Bytes per bucket: 4096 elements of 4 bytes (times `--scale`).
const CAPACITY: u64 = 16 << 10;

/// `--scale K` (1 without it).
static SCALE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn scale() -> usize {
    *SCALE.get().unwrap_or(&1)
}

fn capacity() -> u64 {
    CAPACITY * scale() as u64
}

/// Tensor sizes in elements: mixed, with 0, an exact fill of an empty bucket (after the
/// larger-than-the-bucket tensor, which leaves it empty), and odd sizes around the capacity.
fn counts() -> Vec<usize> {
    let mut c = vec![5, 0, 1000, 3, 9000, 4096, 17, 2500, 1, 4095, 0, 333, 1200, 1200, 1200, 1200, 64];
    c.extend((0..40).map(|i| (i * 97 + 13) % 700));
    c.iter().map(|n| n * scale()).collect()
}

/// Rank `rank`'s element `j` of tensor `t`: small integers, so that FP32 sums are exact.
fn value(rank: u32, t: usize, j: usize) -> i32 {
    ((rank as usize * 7 + t * 3 + j * 5) % 23) as i32 - 11
}

/// One data type and op under test, with its exact reduction.
struct Kind {
    dt: DataType,
    op: ReduceOp,
}

impl Kind {
    fn encode(&self, v: i32) -> [u8; 4] {
        match self.dt {
            DataType::Fp32 => (v as f32).to_ne_bytes(),
            _ => v.to_ne_bytes(),
        }
    }

    fn tensor(&self, rank: u32, t: usize, count: usize) -> Vec<u8> {
        (0..count).flat_map(|j| self.encode(value(rank, t, j))).collect()
    }

    fn expected(&self, n: u32, t: usize, count: usize) -> Vec<u8> {
        (0..count)
            .flat_map(|j| {
                let vals = (0..n).map(|r| value(r, t, j));
                self.encode(match self.op {
                    ReduceOp::Max => vals.max().unwrap_or(0),
                    _ => vals.sum(),
                })
            })
            .collect()
    }
}

/// A deliberately bad call: name, the call, expected code, a word its message must contain.
type Refusal<'a> = (&'static str, Box<dyn Fn() -> u32 + 'a>, u32, &'static str);

struct Run<'a> {
    comm: &'a CComm,
    stream: *mut hccn_stream,
    failures: Vec<String>,
    checks: usize,
}

/// An owned bucket handle, destroyed on drop.
struct BucketHandle(NonNull<hccn_bucket>);

impl BucketHandle {
    fn create(comm: *mut hccn_comm, dt: DataType, op: ReduceOp) -> Result<BucketHandle, (u32, String)> {
        let mut b = null_mut();
        // SAFETY: a valid out pointer and a live communicator.
        check(unsafe { hccn_bucket_create(comm, capacity(), dt as u32, op as u32, &mut b) })?;
        NonNull::new(b).map(BucketHandle).ok_or((4, "hccn_bucket_create gave NULL".into()))
    }

    fn ptr(&self) -> *mut hccn_bucket {
        self.0.as_ptr()
    }
}

impl Drop for BucketHandle {
    fn drop(&mut self) {
        // SAFETY: created by the library, destroyed once.
        unsafe { hccn_bucket_destroy(self.ptr()) };
    }
}

impl Run<'_> {
    fn ok(&mut self, what: &str, r: Result<(), (u32, String)>) -> bool {
        self.checks += 1;
        match r {
            Ok(()) => true,
            Err((code, msg)) => {
                self.failures.push(format!("{what}: returned {code}: {msg}"));
                false
            }
        }
    }

    fn expect(&mut self, what: &str, got: &[u8], want: &[u8]) {
        self.checks += 1;
        if got != want {
            let i = got.chunks(4).zip(want.chunks(4)).position(|(a, b)| a != b);
            self.failures.push(format!("{what}: first wrong element {i:?}"));
        }
    }

    fn sync(&self, stream: *mut hccn_stream) -> Result<(), (u32, String)> {
        if stream.is_null() {
            return Ok(());
        }
        // SAFETY: a live stream handle.
        check(unsafe { hccn_stream_synchronize(stream) })
    }

    /// Adds every tensor, flushes, and checks each against the exact result and the unfused
    /// allreduce.
    fn fused(&mut self, kind: &Kind, use_stream: bool) {
        let (me, n) = (self.comm.rank(), self.comm.size());
        let what = format!("rank {me}/{n}: {} {} stream {use_stream}", kind.dt.name(), kind.op.name());
        let stream = if use_stream { self.stream } else { null_mut() };
        let bucket = match BucketHandle::create(self.comm.comm, kind.dt, kind.op) {
            Ok(b) => b,
            Err((code, msg)) => return self.failures.push(format!("{what}: create returned {code}: {msg}")),
        };
        let counts = counts();
        let mut bufs: Vec<Vec<u8>> = counts.iter().enumerate().map(|(t, &c)| kind.tensor(me, t, c)).collect();
        for (t, buf) in bufs.iter_mut().enumerate() {
            let p = buf.as_mut_ptr().cast::<c_void>();
            // SAFETY: `buf` stays alive and untouched until the flush and synchronize below.
            let r = check(unsafe { hccn_bucket_add(bucket.ptr(), p, counts[t] as u64, stream) });
            if !self.ok(&format!("{what}: add tensor {t}"), r) {
                return;
            }
        }
        // SAFETY: live handles.
        let r = check(unsafe { hccn_bucket_flush(bucket.ptr(), stream) }).and_then(|()| self.sync(stream));
        if !self.ok(&format!("{what}: flush"), r) {
            return;
        }
        // SAFETY: live handles; nothing is pending, so nothing is communicated.
        let r = check(unsafe { hccn_bucket_flush(bucket.ptr(), stream) }).and_then(|()| self.sync(stream));
        self.ok(&format!("{what}: flush with nothing pending"), r);
        for (t, buf) in bufs.iter().enumerate() {
            let tname = format!("{what}: tensor {t} ({} elements)", counts[t]);
            self.expect(&tname, buf, &kind.expected(n, t, counts[t]));
            let mut unfused = kind.tensor(me, t, counts[t]);
            let p = unfused.as_mut_ptr().cast::<c_void>();
            // SAFETY: `unfused` holds counts[t] elements for the blocking call.
            let r = check(unsafe {
                hccn_allreduce(p, p, counts[t] as u64, kind.dt as u32, kind.op as u32, self.comm.comm, null_mut())
            });
            if self.ok(&format!("{tname}: unfused allreduce"), r) {
                self.expect(&format!("{tname}: fused equals unfused"), buf, &unfused);
            }
        }
    }

    /// With a stream, a flush reads its tensors when the stream reaches it: an allreduce queued
    /// before the add has already happened.
    fn stream_order(&mut self) {
        let (me, n) = (self.comm.rank(), self.comm.size());
        let kind = Kind { dt: DataType::Fp32, op: ReduceOp::Sum };
        let what = format!("rank {me}/{n}: stream order");
        let Ok(bucket) = BucketHandle::create(self.comm.comm, kind.dt, kind.op) else {
            return self.failures.push(format!("{what}: create failed"));
        };
        let count = 3000;
        let mut buf = kind.tensor(me, 0, count);
        let p = buf.as_mut_ptr().cast::<c_void>();
        let (fp32, sum) = (DataType::Fp32 as u32, ReduceOp::Sum as u32);
        // SAFETY: `buf` lives, untouched, until the synchronize.
        let r = check(unsafe { hccn_allreduce(p, p, count as u64, fp32, sum, self.comm.comm, self.stream) })
            // SAFETY: as above.
            .and_then(|()| check(unsafe { hccn_bucket_add(bucket.ptr(), p, count as u64, self.stream) }))
            // SAFETY: as above.
            .and_then(|()| check(unsafe { hccn_bucket_flush(bucket.ptr(), self.stream) }))
            .and_then(|()| self.sync(self.stream));
        if self.ok(&what, r) {
            let want: Vec<u8> = kind
                .expected(n, 0, count)
                .chunks(4)
                .flat_map(|b| (f32::from_ne_bytes([b[0], b[1], b[2], b[3]]) * n as f32).to_ne_bytes())
                .collect();
            self.expect(&what, &buf, &want);
        }
    }

    /// Destroy is local and does not flush: a pending tensor is left as it was.
    fn destroy_drops_pending(&mut self) {
        let kind = Kind { dt: DataType::Int32, op: ReduceOp::Sum };
        let Ok(bucket) = BucketHandle::create(self.comm.comm, kind.dt, kind.op) else {
            return self.failures.push("destroy: create failed".into());
        };
        let mut buf = kind.tensor(self.comm.rank(), 1, 100);
        // SAFETY: `buf` outlives the bucket, which is destroyed without a flush.
        let r = check(unsafe { hccn_bucket_add(bucket.ptr(), buf.as_mut_ptr().cast(), 100, null_mut()) });
        self.ok("destroy: add", r);
        drop(bucket);
        self.expect("destroy: the pending tensor is untouched", &buf, &kind.tensor(self.comm.rank(), 1, 100));
    }

    /// Runs each call and checks its code and message at once (the message is per thread and
    /// per failing call).
    fn refusals(&mut self, cases: Vec<Refusal<'_>>) {
        for (what, call, want, needle) in cases {
            self.checks += 1;
            let got = call();
            expect_refusal(&mut self.failures, what, got, want, needle);
        }
    }

    fn bad_input(&mut self) {
        let (comm, stream) = (self.comm.comm, self.stream);
        let (fp32, sum) = (DataType::Fp32 as u32, ReduceOp::Sum as u32);
        let out = std::cell::Cell::new(null_mut::<hccn_bucket>());
        let create = |c: *mut hccn_comm, cap: u64, dt: u32, op: u32, null_out: bool| {
            let mut b = null_mut::<hccn_bucket>();
            let o = if null_out { null_mut() } else { &mut b as *mut _ };
            // SAFETY: arguments the library must check before using them.
            let r = unsafe { hccn_bucket_create(c, cap, dt, op, o) };
            out.set(b);
            r
        };
        self.refusals(vec![
            ("create on NULL comm", Box::new(|| create(null_mut(), CAPACITY, fp32, sum, false)), 2, "comm"),
            ("create with capacity 0", Box::new(|| create(comm, 0, fp32, sum, false)), 1, "capacity_bytes 0"),
            ("create smaller than an element", Box::new(|| create(comm, 3, fp32, sum, false)), 1, "one fp32 element"),
            ("create with unknown dtype", Box::new(|| create(comm, CAPACITY, 99, sum, false)), 1, "data type 99"),
            ("create with unknown op", Box::new(|| create(comm, CAPACITY, fp32, 9, false)), 1, "reduce op 9"),
            ("create with NULL out", Box::new(|| create(comm, CAPACITY, fp32, sum, true)), 2, "bucket"),
            (
                "create on a stream handle",
                Box::new(|| create(stream.cast(), CAPACITY, fp32, sum, false)),
                1,
                "not a live communicator",
            ),
        ]);
        if !out.get().is_null() {
            self.failures.push("a failing create wrote its output".into());
        }
        let Ok(bucket) = BucketHandle::create(comm, DataType::Fp32, ReduceOp::Sum) else {
            return self.failures.push("bad input: create failed".into());
        };
        let b = bucket.ptr();
        let mut buf = vec![1f32; 64];
        let p = buf.as_mut_ptr().cast::<c_void>();
        let overlapping = p.cast::<f32>().wrapping_add(16).cast::<c_void>();
        // SAFETY: `buf` lives until the flush below.
        let first = check(unsafe { hccn_bucket_add(b, p, 32, null_mut()) });
        self.ok("bad input: first add", first);
        let add = |b: *mut hccn_bucket, p: *mut c_void, count: u64, s: *mut hccn_stream| {
            // SAFETY: arguments the library must refuse before touching anything.
            unsafe { hccn_bucket_add(b, p, count, s) }
        };
        let flush = |b: *mut hccn_bucket| {
            // SAFETY: handles the library must refuse.
            unsafe { hccn_bucket_flush(b, null_mut()) }
        };
        self.refusals(vec![
            ("add to NULL bucket", Box::new(|| add(null_mut(), p, 4, null_mut())), 2, "bucket"),
            ("add NULL buf", Box::new(|| add(b, null_mut(), 4, null_mut())), 2, "buf"),
            ("add overflowing count", Box::new(|| add(b, p, u64::MAX / 2, null_mut())), 1, "overflows"),
            ("add overlapping a pending tensor", Box::new(|| add(b, overlapping, 8, null_mut())), 1, "overlaps"),
            ("add to a comm handle", Box::new(|| add(comm.cast(), p, 4, null_mut())), 1, "not a live bucket"),
            ("add with a comm as stream", Box::new(|| add(b, p, 4, comm.cast())), 1, "not a live stream"),
            ("flush NULL bucket", Box::new(|| flush(null_mut())), 2, "bucket"),
            ("flush a stream handle", Box::new(|| flush(stream.cast())), 1, "not a live bucket"),
        ]);
        // The refusals changed nothing: the first 32 elements are still the only pending ones.
        if self.ok("bad input: flush after refusals", check(flush(b))) {
            let n = self.comm.size() as f32;
            let mut want = vec![n; 32];
            want.extend([1f32; 32]);
            self.checks += 1;
            if buf != want {
                self.failures.push("bad input: the pending tensor was not reduced exactly once".into());
            }
        }
        drop(bucket);
        // SAFETY: NULL is a no-op.
        let null_destroy = unsafe { hccn_bucket_destroy(null_mut()) };
        if null_destroy != 0 {
            self.failures.push("hccn_bucket_destroy(NULL) must be a no-op".into());
        }
        // `b` was destroyed above: using it again is refused.
        self.refusals(vec![("flush a destroyed bucket", Box::new(|| flush(b)), 1, "not a live bucket")]);
    }

    /// A bucket must not outlive its communicator handle: using it afterwards is refused.
    fn comm_destroyed_first(&mut self) {
        let mut sub = null_mut();
        // SAFETY: a live communicator and a valid out pointer; collective over all ranks.
        let r = check(unsafe { hccn_comm_split(self.comm.comm, 0, 0, &mut sub) });
        if !self.ok("split", r) {
            return;
        }
        let Ok(bucket) = BucketHandle::create(sub, DataType::Fp32, ReduceOp::Sum) else {
            return self.failures.push("create on the split communicator failed".into());
        };
        let mut x = [1f32; 4];
        // SAFETY: the handle came from split and is destroyed once; then the bucket is used.
        let got = unsafe {
            hccn_comm_destroy(sub);
            hccn_bucket_add(bucket.ptr(), x.as_mut_ptr().cast(), 4, null_mut())
        };
        self.checks += 1;
        expect_refusal(
            &mut self.failures,
            "add after the communicator was destroyed",
            got,
            1,
            "destroy buckets before",
        );
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(k) = args.iter().position(|a| a == "--scale").and_then(|i| args.get(i + 1)) {
        match k.parse::<usize>() {
            Ok(k) if k > 0 => {
                let _ = SCALE.set(k);
            }
            _ => {
                println!("FAIL --scale {k:?} is not a positive number");
                return ExitCode::FAILURE;
            }
        }
    }
    let comm = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let stream = match hccn_tests::capi::new_stream() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut run = Run { comm: &comm, stream, failures: Vec::new(), checks: 0 };
    for kind in [Kind { dt: DataType::Fp32, op: ReduceOp::Sum }, Kind { dt: DataType::Int32, op: ReduceOp::Max }] {
        for use_stream in [false, true] {
            run.fused(&kind, use_stream);
        }
    }
    run.stream_order();
    run.destroy_drops_pending();
    run.bad_input();
    run.comm_destroyed_first();
    // SAFETY: the stream came from the library and is destroyed once.
    unsafe { hccn_stream_destroy(stream) };
    for f in &run.failures {
        println!("FAIL {f}");
    }
    println!("rank {} of {}: {} checks, {} failures", comm.rank(), comm.size(), run.checks, run.failures.len());
    if run.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
