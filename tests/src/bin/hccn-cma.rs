//! Collectives whose ring chunks straddle and exceed the single-copy (CMA) threshold, printing a
//! hash of every result's bits, so that a test can compare HCCN_CMA=off with auto bit for bit.
//! Allgather results are also checked exactly. Usage: hccnrun -n N hccn-cma
//! Prints `HASH op=.. count=.. bits=..` per operation and `WRONG n` at the end.

use std::ffi::c_void;
use std::process::ExitCode;

use hccn::*;
use hccn_tests::capi::{check, CComm};
use hccn_tests::Coll;

const FP32: u32 = 4;
const BF16: u32 = 11;
const SUM: u32 = 0;

/// FNV-1a over the bytes of `v`.
fn hash(v: &[f32]) -> u64 {
    v.iter()
        .flat_map(|x| x.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Element j of rank r: not exactly representable sums, so the bits depend on the order of the
/// additions, which both paths must keep.
fn value(r: u32, j: usize) -> f32 {
    (j % 1013) as f32 * 0.37 + r as f32 * 0.011 + 0.1
}

fn run(c: &CComm, count: usize) -> Result<usize, (u32, String)> {
    let (me, n) = (c.rank(), c.size() as usize);
    let send: Vec<f32> = (0..count).map(|j| value(me, j)).collect();
    let mut recv = vec![0f32; count];
    let out = |p: &mut [f32]| p.as_mut_ptr().cast::<c_void>();
    let s = std::ptr::null_mut();
    // SAFETY: send and recv hold `count` floats and outlive each blocking call.
    check(unsafe { hccn_allreduce(send.as_ptr().cast(), out(&mut recv), count as u64, FP32, SUM, c.comm, s) })?;
    println!("HASH op=allreduce count={count} bits={:016x}", hash(&recv));
    // SAFETY: as above; the compressed ring sends owned, converted chunks.
    check(unsafe {
        hccn_allreduce_compressed(send.as_ptr().cast(), out(&mut recv), count as u64, FP32, BF16, SUM, c.comm, s)
    })?;
    println!("HASH op=allreduce_bf16 count={count} bits={:016x}", hash(&recv));
    let block = count / n;
    let mut rs = vec![0f32; block];
    // SAFETY: send holds n * block floats or more, rs holds block.
    check(unsafe { hccn_reduce_scatter(send.as_ptr().cast(), out(&mut rs), block as u64, FP32, SUM, c.comm, s) })?;
    println!("HASH op=reduce_scatter count={count} bits={:016x}", hash(&rs));
    let mut all = vec![0f32; block * n];
    // SAFETY: send holds at least block floats, all holds n * block.
    check(unsafe { hccn_allgather(send.as_ptr().cast(), out(&mut all), block as u64, FP32, c.comm, s) })?;
    println!("HASH op=allgather count={count} bits={:016x}", hash(&all));
    let wrong =
        all.iter().enumerate().filter(|(i, v)| **v != value((i / block.max(1)) as u32, i % block.max(1))).count();
    Ok(wrong)
}

fn main() -> ExitCode {
    let comm = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let n = comm.size() as usize;
    // Segments just below and above 64 KiB, odd counts, and chunks far above the threshold.
    let counts = [5, n * 16384 - 1, n * 16384 + 3, n * 65536 + 7, 1_000_003, 3_000_017];
    let mut wrong = 0;
    for count in counts {
        match run(&comm, count) {
            Ok(w) => wrong += w,
            Err((code, msg)) => {
                println!("FAIL count={count} code={code} {msg}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!("WRONG {wrong}");
    if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
