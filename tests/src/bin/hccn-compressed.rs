//! Compressed allreduce through the C ABI in one rank of a job started by hccnrun: FP32 over FP16
//! and BF16 wires, every op, counts 0/1/odd/multi-chunk, out of place, in place and on a stream.
//! Every result is checked against the exact reduction (computed in f64) with the bound stated in
//! docs/algorithms.md, and all ranks must end with the same bits. Then bad input.
//! Usage: hccnrun -n N hccn-compressed   (with HCCN_CHUNK_BYTES=4096 the larger counts take many chunks)

use std::ffi::c_void;
use std::process::ExitCode;
use std::ptr::{null, null_mut};

use half::{bf16, f16};
use hccn::*;
use hccn_runtime::{DataType, ReduceOp};
use hccn_tests::capi::{check, expect_refusal, CComm};
use hccn_tests::Coll;

const COUNTS: [usize; 5] = [0, 1, 7, 1023, 20000];
const FP32: u32 = DataType::Fp32 as u32;
const U32_ROUNDOFF: f64 = 1.0 / (1u64 << 24) as f64;

fn mix(mut x: u64) -> u64 {
    // splitmix64: a cheap, well-spread hash of (rank, element).
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Rank `rank`'s element `j`: both signs and magnitudes 2^-6 .. 2^6 (so that sums cancel and
/// some values are FP16 subnormals), or [0.5, 2) for products.
fn input(op: ReduceOp, rank: u32, j: usize) -> f32 {
    let h = mix(u64::from(rank) << 40 | j as u64);
    let unit = (h >> 40) as f32 / (1u64 << 24) as f32;
    match op {
        ReduceOp::Prod => 0.5 + 1.5 * unit,
        _ => (2.0 * unit - 1.0) * 2f32.powi((h % 13) as i32 - 6),
    }
}

/// Unit roundoff and half the smallest subnormal of the wire type.
fn wire_params(wire: DataType) -> (f64, f64) {
    match wire {
        DataType::Bf16 => (2f64.powi(-8), 2f64.powi(-134)),
        _ => (2f64.powi(-11), 2f64.powi(-25)),
    }
}

fn round_wire(x: f32, wire: DataType) -> f32 {
    match wire {
        DataType::Bf16 => bf16::from_f32(x).to_f32(),
        _ => f16::from_f32(x).to_f32(),
    }
}

/// Checks one result element against the documented bound; returns error / bound (0 for the
/// exact ops).
fn check_element(op: ReduceOp, wire: DataType, xs: &[f32], got: f32) -> Result<f64, String> {
    let n = xs.len() as i32;
    let (u, eta) = wire_params(wire);
    let gamma = (1.0 + u).powi(n) * (1.0 + U32_ROUNDOFF).powi(n - 1) - 1.0;
    let sum: f64 = xs.iter().map(|&x| f64::from(x)).sum();
    let abs: f64 = xs.iter().map(|&x| f64::from(x).abs()).sum();
    let sum_bound = gamma * abs + f64::from(n) * eta * (1.0 + gamma);
    let representable = || {
        if round_wire(got, wire).to_bits() == got.to_bits() {
            Ok(())
        } else {
            Err(format!("{got:e} is not a {} value", wire.name()))
        }
    };
    let within = |want: f64, bound: f64| {
        let err = (f64::from(got) - want).abs();
        if err <= bound {
            Ok(if bound > 0.0 { err / bound } else { 0.0 })
        } else {
            Err(format!("got {got:e}, exact {want:e}: error {err:e} exceeds the bound {bound:e}"))
        }
    };
    match op {
        ReduceOp::Max | ReduceOp::Min => {
            let pick = if op == ReduceOp::Max { f32::max } else { f32::min };
            let want = round_wire(xs.iter().copied().fold(xs[0], pick), wire);
            if got.to_bits() == want.to_bits() {
                Ok(0.0)
            } else {
                Err(format!("got {got:e}, want exactly {want:e} (the exact result rounded once)"))
            }
        }
        ReduceOp::Sum => representable().and_then(|()| within(sum, sum_bound)),
        ReduceOp::Avg => {
            let nf = f64::from(n);
            within(sum / nf, sum_bound / nf + U32_ROUNDOFF * (abs + sum_bound) / nf)
        }
        ReduceOp::Prod => {
            let prod: f64 = xs.iter().map(|&x| f64::from(x)).product();
            // The f64 product of up to 8 factors is itself within 8 * 2^-53 relative.
            representable().and_then(|()| within(prod, (gamma + 1e-15) * prod.abs()))
        }
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    OutOfPlace,
    InPlace,
    Stream,
}

struct Run<'a> {
    comm: &'a CComm,
    stream: *mut hccn_stream,
    failures: Vec<String>,
    checks: usize,
    /// Largest error / bound seen per (wire, op), for the report.
    worst: Vec<(String, f64)>,
}

impl Run<'_> {
    fn fail(&mut self, what: String) {
        self.failures.push(what);
    }

    /// True when every rank's `bytes` hash the same.
    fn same_on_all_ranks(&mut self, bytes: &[u8]) -> Result<bool, (u32, String)> {
        let mine = fnv(bytes);
        let mut all = vec![0u64; self.comm.size() as usize];
        // SAFETY: one u64 in, `size` u64s out, live for the blocking call.
        check(unsafe {
            hccn_allgather(
                (&mine as *const u64).cast(),
                all.as_mut_ptr().cast(),
                1,
                DataType::Uint64 as u32,
                self.comm.comm,
                null_mut(),
            )
        })?;
        Ok(all.iter().all(|h| *h == mine))
    }

    fn case(&mut self, wire: DataType, op: ReduceOp, count: usize, mode: Mode) {
        let (me, n) = (self.comm.rank(), self.comm.size());
        let what = format!("rank {me}/{n}: {} over {} count {count} {mode:?}", op.name(), wire.name());
        let send: Vec<f32> = (0..count).map(|j| input(op, me, j)).collect();
        let mut recv = if mode == Mode::OutOfPlace { vec![f32::NAN; count] } else { send.clone() };
        let sp: *const c_void = if mode == Mode::OutOfPlace { send.as_ptr().cast() } else { recv.as_ptr().cast() };
        let stream = if mode == Mode::Stream { self.stream } else { null_mut() };
        // SAFETY: `send` and `recv` hold `count` floats and live until the call (and, on a
        // stream, the synchronize below) is done.
        let mut r = check(unsafe {
            hccn_allreduce_compressed(
                sp,
                recv.as_mut_ptr().cast(),
                count as u64,
                FP32,
                wire as u32,
                op as u32,
                self.comm.comm,
                stream,
            )
        });
        if r.is_ok() && mode == Mode::Stream {
            // SAFETY: a live stream handle.
            r = check(unsafe { hccn_stream_synchronize(self.stream) });
        }
        if let Err((code, msg)) = r {
            return self.fail(format!("{what}: returned {code}: {msg}"));
        }
        let mut worst = 0f64;
        for (j, &got) in recv.iter().enumerate() {
            self.checks += 1;
            let xs: Vec<f32> = (0..n).map(|rank| input(op, rank, j)).collect();
            match check_element(op, wire, &xs, got) {
                Ok(ratio) => worst = worst.max(ratio),
                Err(e) => {
                    // Report the first wrong element only, but go on to the allgather below:
                    // the other ranks are in it.
                    self.fail(format!("{what}: element {j}: {e}"));
                    break;
                }
            }
        }
        let key = format!("{} {}", wire.name(), op.name());
        match self.worst.iter_mut().find(|(k, _)| *k == key) {
            Some((_, w)) => *w = w.max(worst),
            None => self.worst.push((key, worst)),
        }
        let bytes: Vec<u8> = recv.iter().flat_map(|x| x.to_ne_bytes()).collect();
        self.checks += 1;
        match self.same_on_all_ranks(&bytes) {
            Ok(true) => {}
            Ok(false) => self.fail(format!("{what}: ranks ended with different bits")),
            Err((code, msg)) => self.fail(format!("{what}: hash allgather returned {code}: {msg}")),
        }
    }

    fn bad_input(&mut self) {
        let comm = self.comm.comm;
        let x = [1.0f32; 8];
        let mut y = [0f32; 8];
        let (s, r) = (x.as_ptr().cast::<c_void>(), y.as_mut_ptr().cast::<c_void>());
        let (fp16, bf16) = (DataType::Fp16 as u32, DataType::Bf16 as u32);
        let (int32, fp64) = (DataType::Int32 as u32, DataType::Fp64 as u32);
        let sum = ReduceOp::Sum as u32;
        // (what, dt, wire_dt, op, sendbuf, recvbuf, count, comm, expected code, message needle)
        type Case = (&'static str, u32, u32, u32, *const c_void, *mut c_void, u64, *mut hccn_comm, u32, &'static str);
        let overlapping = (s as *mut f32).wrapping_add(1).cast::<c_void>();
        let cases: Vec<Case> = vec![
            ("int32 over fp16", int32, fp16, sum, s, r, 8, comm, 1, "floating-point"),
            ("fp32 over fp32", FP32, FP32, sum, s, r, 8, comm, 1, "narrower"),
            ("fp16 over bf16", fp16, bf16, sum, s, r, 8, comm, 1, "narrower"),
            ("fp32 over int8", FP32, DataType::Int8 as u32, sum, s, r, 8, comm, 1, "wire_dt int8"),
            ("fp64 over fp32", fp64, FP32, sum, s, r, 4, comm, 5, "not implemented"),
            ("unknown wire_dt", FP32, 99, sum, s, r, 8, comm, 1, "wire_dt"),
            ("unknown dt", 99, fp16, sum, s, r, 8, comm, 1, "data type 99"),
            ("unknown op", FP32, bf16, 9, s, r, 8, comm, 1, "reduce op 9"),
            ("null sendbuf", FP32, bf16, sum, null(), r, 8, comm, 2, "sendbuf"),
            ("null recvbuf", FP32, fp16, sum, s, null_mut(), 8, comm, 2, "recvbuf"),
            ("null comm", FP32, fp16, sum, s, r, 8, null_mut(), 2, "comm"),
            ("partial overlap", FP32, fp16, sum, s, overlapping, 4, comm, 1, "overlap"),
            ("overflowing count", FP32, fp16, sum, s, r, u64::MAX / 2, comm, 1, "overflows"),
        ];
        for (what, dt, wire, op, sp, rp, count, c, want, needle) in cases {
            self.checks += 1;
            // SAFETY: live buffers of 8 floats, NULL, or arguments the library must refuse
            // before touching anything.
            let got = unsafe { hccn_allreduce_compressed(sp, rp, count, dt, wire, op, c, null_mut()) };
            expect_refusal(&mut self.failures, what, got, want, needle);
        }
        // SAFETY: live buffers of 8 floats.
        let after = check(unsafe { hccn_allreduce_compressed(s, r, 8, FP32, bf16, sum, comm, null_mut()) });
        self.checks += 1;
        if after.is_err() || y != [self.comm.size() as f32; 8] {
            self.fail(format!("the communicator must still work after bad input: {after:?}, {y:?}"));
        }
    }
}

fn main() -> ExitCode {
    let comm = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let stream = match hccn_tests::capi::new_stream() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut run = Run { comm: &comm, stream, failures: Vec::new(), checks: 0, worst: Vec::new() };
    for wire in [DataType::Fp16, DataType::Bf16] {
        for op in ReduceOp::ALL {
            for count in COUNTS {
                for mode in [Mode::OutOfPlace, Mode::InPlace, Mode::Stream] {
                    run.case(wire, op, count, mode);
                }
            }
        }
    }
    run.bad_input();
    // SAFETY: the stream came from the library and is destroyed once.
    unsafe { hccn_stream_destroy(stream) };
    if comm.rank() == 0 {
        for (key, w) in &run.worst {
            println!("worst error / bound: {key}: {w:.4}");
        }
    }
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
