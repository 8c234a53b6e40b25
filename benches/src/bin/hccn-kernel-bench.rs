//! Reduction kernel throughput beside memcpy on the same buffers.
//!
//! Usage: hccn-kernel-bench [--quick] [--only fp32_sum]
//!
//! For each buffer size, `dst op= src` (runtime/src/reduce) and `dst = src` (memcpy) run over the
//! same two buffers; GB/s counts the bytes of `dst` processed per second for both, so "% memcpy"
//! compares the time to reduce a buffer with the time to copy it. A reduction reads two streams
//! and writes one where memcpy reads one and writes one, so out of cache it moves 1.5× the
//! memory traffic of memcpy for the same count. "% traffic" counts that traffic, as STREAM
//! does (its Add moves 3 words per element, its Copy 2): the share of memcpy's memory bandwidth
//! the kernel reaches. Each cell is the median of 5 repetitions of
//! about 0.1 s (0.02 s with --quick). The element-at-a-time reference (`scalar`) is shown for
//! f32 sum, and so is `out = dst + src` into a third buffer (`fp32_sum_from`, the out-of-place
//! form an allreduce uses). Every kernel's result is checked against that reference once per size.

use std::hint::black_box;
use std::time::Instant;

use hccn_benches::percentile;
use hccn_runtime::reduce::{isa, reduce_from, reduce_into, reduce_into_scalar};
use hccn_runtime::{DataType, ReduceOp};

/// Median seconds per call of `f` over 5 repetitions of about `budget` seconds each.
fn time(budget: f64, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    f();
    let once = t.elapsed().as_secs_f64().max(1e-9);
    let iters = ((budget / once) as usize).clamp(1, 1_000_000);
    let mut reps: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .collect();
    percentile(&mut reps, 50.0)
}

fn fill(buf: &mut [u8], dt: DataType, seed: u32) {
    let es = dt.size();
    for (i, e) in buf.chunks_exact_mut(es).enumerate() {
        // Small finite values of every type: the sums never overflow into inf or NaN.
        let v = ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 7) as u8 + 1;
        match dt {
            DataType::Fp32 => e.copy_from_slice(&f32::from(v).to_ne_bytes()),
            DataType::Fp64 => e.copy_from_slice(&f64::from(v).to_ne_bytes()),
            DataType::Fp16 => e.copy_from_slice(&[0, 0x3c + (v & 1)]),
            DataType::Bf16 => e.copy_from_slice(&[0, 0x3f + (v & 1)]),
            _ => {
                e.fill(0);
                e[0] = v;
            }
        }
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let only: Option<String> = std::env::args().skip_while(|a| a != "--only").nth(1);
    let budget = if quick { 0.02 } else { 0.1 };
    let sizes: &[usize] =
        if quick { &[64 << 10, 1 << 20, 16 << 20] } else { &[64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20] };
    let kernels: &[(DataType, ReduceOp)] = &[
        (DataType::Fp32, ReduceOp::Sum),
        (DataType::Fp32, ReduceOp::Max),
        (DataType::Fp32, ReduceOp::Prod),
        (DataType::Fp64, ReduceOp::Sum),
        (DataType::Int32, ReduceOp::Sum),
        (DataType::Int8, ReduceOp::Min),
        (DataType::Fp16, ReduceOp::Sum),
        (DataType::Bf16, ReduceOp::Sum),
    ];
    println!("# hccn-kernel-bench  isa: {:?}  (GB/s of dst bytes processed; median of 5)", isa());
    println!("{:>10}  {:>12}  {:>9}  {:>8}  {:>9}", "size", "kernel", "GB/s", "% memcpy", "% traffic");
    let mut wrong = 0;
    for &size in sizes {
        let mut dst = vec![0u8; size];
        let mut src = vec![0u8; size];
        let gbs = |secs: f64| size as f64 / secs / 1e9;
        // Both buffers touched with data first: memcpy from never-written (calloc'd) memory
        // reads the kernel's shared zero page from L1 and would report write bandwidth only.
        fill(&mut src, DataType::Fp32, 1);
        fill(&mut dst, DataType::Fp32, 2);
        let memcpy = gbs(time(budget, || black_box(&mut dst[..]).copy_from_slice(black_box(&src[..]))));
        println!("{:>10}  {:>12}  {memcpy:>9.2}  {:>8}  {:>9}", size, "memcpy", "100%", "100%");
        for &(dt, op) in kernels {
            if only.as_ref().is_some_and(|o| *o != format!("{}_{}", dt.name(), op.name())) {
                continue;
            }
            fill(&mut src, dt, 1);
            fill(&mut dst, dt, 2);
            let mut want = dst.clone();
            reduce_into_scalar(&mut want, &src, dt, op);
            let mut got = dst.clone();
            reduce_into(&mut got, &src, dt, op);
            if got != want {
                wrong += 1;
                eprintln!("hccn-kernel-bench: {dt:?} {op:?} at {size} bytes differs from the reference");
            }
            drop((want, got));
            // The timed loop reduces into dst over and over: float sums and products grow and
            // may reach infinity, which costs the same per element (no subnormals arise).
            let k = gbs(time(budget, || reduce_into(black_box(&mut dst[..]), black_box(&src[..]), dt, op)));
            let name = format!("{}_{}", dt.name(), op.name());
            // Bytes moved: the kernel reads dst and src and writes dst (3), memcpy reads and writes (2).
            let traffic = 100.0 * (3.0 * k) / (2.0 * memcpy);
            println!("{:>10}  {name:>12}  {k:>9.2}  {:>7.0}%  {traffic:>8.0}%", size, 100.0 * k / memcpy);
            if dt == DataType::Fp32 && op == ReduceOp::Sum {
                let s = gbs(time(budget, || reduce_into_scalar(black_box(&mut dst[..]), black_box(&src[..]), dt, op)));
                println!("{:>10}  {:>12}  {s:>9.2}  {:>7.0}%", size, "fp32_sum_ref", 100.0 * s / memcpy);
                // Out of place, `out = dst + src` (an allreduce's input with what arrived):
                // the same traffic, written to a third buffer.
                let mut out = vec![0u8; size];
                fill(&mut out, dt, 3);
                let f = gbs(time(budget, || {
                    reduce_from(black_box(&mut out[..]), black_box(&dst[..]), black_box(&src[..]), dt, op)
                }));
                let traffic = 100.0 * (3.0 * f) / (2.0 * memcpy);
                println!(
                    "{:>10}  {:>12}  {f:>9.2}  {:>7.0}%  {traffic:>8.0}%",
                    size,
                    "fp32_sum_from",
                    100.0 * f / memcpy
                );
            }
        }
    }
    if wrong > 0 {
        std::process::exit(1);
    }
}
