//! Fusion and compression benchmarks, run under hccnrun (rank 0 prints):
//!
//!   hccnrun -n 2 target/release/hccn-fusion-bench [--layers N] [--iters N] [--bucket-mib N]
//!                                                 [--only fusion|compression]
//!
//! Fusion: the FP32 gradients of a BERT-Large-like model (N encoder layers, default 24, plus
//! embeddings, pooler and pre-training heads: hundreds of tensors from 8 B to 16 MiB) allreduced
//! once per tensor, then through a fusion bucket (default 25 MiB, PyTorch DDP's default), in
//! backward order. The 119 MiB word-embedding table is left out: larger than any bucket, it is one
//! allreduce either way. The same again for the small gradients only (biases, LayerNorm), where
//! per-collective latency dominates. Compression: FP32 allreduce against FP32 carried as BF16 and
//! FP16, at 1, 16 and 64 MiB. The modes take turns; times are medians (default 5 iterations) of
//! the slowest rank's time.

use std::process::ExitCode;
use std::time::Instant;

use hccn_runtime::{Bucket, Communicator, Config, DataType, LaunchEnv, Op, Ptr, ReduceOp, Result};

struct Options {
    layers: usize,
    iters: u32,
    bucket_mib: u64,
    fusion: bool,
    compression: bool,
}

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options { layers: 24, iters: 5, bucket_mib: 25, fusion: true, compression: true };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, v: String| v.parse::<u64>().map_err(|_| format!("{name}: not a number: {v:?}"));
        match a.as_str() {
            "--layers" => o.layers = number(&a, value(&a)?)? as usize,
            "--iters" => o.iters = number(&a, value(&a)?)?.max(1) as u32,
            "--bucket-mib" => o.bucket_mib = number(&a, value(&a)?)?.max(1),
            "--only" => match value(&a)?.as_str() {
                "fusion" => o.compression = false,
                "compression" => o.fusion = false,
                v => return Err(format!("--only: fusion or compression, not {v:?}")),
            },
            _ => return Err(format!("unknown argument {a:?} (see the comment at the top of hccn-fusion-bench.rs)")),
        }
    }
    Ok(o)
}

/// Gradient sizes (elements) of BERT-Large's parameters in backward order: heads first,
/// embeddings last.
fn bert_large(layers: usize) -> Vec<usize> {
    const H: usize = 1024;
    const FFN: usize = 4 * H;
    let mut forward = vec![512 * H, 2 * H, H, H]; // position and token-type embeddings, LayerNorm
    for _ in 0..layers {
        forward.extend([H * H, H, H * H, H, H * H, H, H * H, H]); // attention q, k, v, output
        forward.extend([H, H]); // attention LayerNorm
        forward.extend([H * FFN, FFN, FFN * H, H]); // feed-forward
        forward.extend([H, H]); // output LayerNorm
    }
    forward.extend([H * H, H]); // pooler
    forward.extend([H * H, H, H, H]); // masked-LM transform and its LayerNorm
    forward.extend([2 * H, 2]); // next-sentence classifier
    forward.reverse();
    forward
}

/// Runs `f(mode)` for every mode `iters` times, the modes taking turns (so that a noisy
/// neighbour slows them alike), after one warm-up each. Returns each mode's median seconds per
/// call, taking each sample from the slowest rank.
fn time_modes(
    comm: &Communicator,
    modes: usize,
    iters: u32,
    mut f: impl FnMut(usize) -> Result<()>,
) -> Result<Vec<f64>> {
    (0..modes).try_for_each(&mut f)?;
    let mut samples = Vec::with_capacity(modes * iters as usize);
    for _ in 0..iters {
        for m in 0..modes {
            // SAFETY: a barrier touches no caller memory.
            unsafe { comm.submit(Op::Barrier, None)? };
            let t0 = Instant::now();
            f(m)?;
            samples.push(t0.elapsed().as_secs_f64());
        }
    }
    let mut slowest = vec![0f64; samples.len()];
    comm.all_reduce(&samples, &mut slowest, ReduceOp::Max)?;
    Ok((0..modes)
        .map(|m| {
            let mut v: Vec<f64> = slowest.iter().skip(m).step_by(modes).copied().collect();
            hccn_benches::percentile(&mut v, 50.0)
        })
        .collect())
}

/// One allreduce per gradient, then the same gradients through a bucket.
fn fusion_case(comm: &Communicator, o: &Options, title: &str, counts: &[usize]) -> Result<()> {
    let total: usize = counts.iter().sum::<usize>() * 4;
    let mut grads: Vec<Vec<f32>> = counts.iter().map(|&c| vec![1.0; c]).collect();
    let mut bucket = Bucket::new(comm.clone(), o.bucket_mib << 20, DataType::Fp32, ReduceOp::Sum)?;
    let mut fused_collectives = 0;
    let times = time_modes(comm, 2, o.iters, |mode| {
        let before = bucket.collectives();
        for g in grads.iter_mut() {
            let (p, count) = (Ptr::from_mut(g.as_mut_ptr()), g.len() as u64);
            if mode == 0 {
                let op = Op::AllReduce { send: p, recv: p, count, dt: DataType::Fp32, op: ReduceOp::Sum };
                // SAFETY: `g` is live and not otherwise touched during the blocking call.
                unsafe { comm.submit(op, None)? };
            } else {
                // SAFETY: `g` stays live and untouched until the flush below returns (no stream).
                unsafe { bucket.add(p, count, None)? };
            }
        }
        bucket.flush(None)?;
        fused_collectives = bucket.collectives() - before;
        Ok(())
    })?;
    if comm.rank() == 0 {
        let (smallest, largest) = (counts.iter().min().unwrap_or(&0) * 4, counts.iter().max().unwrap_or(&0) * 4);
        println!(
            "# fusion, {title}: {} tensors of {smallest} B .. {:.0} KiB, {:.1} MiB in all, {} ranks, median of {}",
            counts.len(),
            largest as f64 / 1024.0,
            total as f64 / (1 << 20) as f64,
            comm.size(),
            o.iters
        );
        println!("{:<28} {:>11} {:>10} {:>12}", "mode", "collectives", "time (ms)", "algbw (GB/s)");
        let bucket_name = format!("bucket {} MiB", o.bucket_mib);
        for (mode, n, t) in
            [("one allreduce per tensor", counts.len() as u64, times[0]), (&*bucket_name, fused_collectives, times[1])]
        {
            println!("{mode:<28} {n:>11} {:>10.2} {:>12.3}", t * 1e3, total as f64 / t / 1e9);
        }
        println!("fused / unfused time: {:.3}", times[1] / times[0]);
    }
    Ok(())
}

fn fusion(comm: &Communicator, o: &Options) -> Result<()> {
    let all = bert_large(o.layers);
    fusion_case(comm, o, "all BERT-Large gradients", &all)?;
    // Biases, LayerNorm parameters and the classifier: where per-collective latency dominates.
    let small: Vec<usize> = all.iter().copied().filter(|&c| c * 4 <= 64 << 10).collect();
    fusion_case(comm, o, "the gradients of 64 KiB or less", &small)
}

fn compression(comm: &Communicator, o: &Options) -> Result<()> {
    if comm.rank() == 0 {
        println!("# compression: FP32 allreduce (SUM) as it is and over 16-bit wires, {} ranks", comm.size());
        println!("{:>9} {:<12} {:>10} {:>12} {:>9}", "size", "wire", "time (ms)", "algbw (GB/s)", "speedup");
    }
    let wires = [None, Some(DataType::Bf16), Some(DataType::Fp16)];
    for mib in [1usize, 16, 64] {
        let count = (mib << 20) / 4;
        let send = vec![1.0f32; count];
        let mut recv = vec![0.0f32; count];
        let (s, r) = (Ptr::from_const(send.as_ptr()), Ptr::from_mut(recv.as_mut_ptr()));
        let (dt, op, n) = (DataType::Fp32, ReduceOp::Sum, count as u64);
        // More iterations for small sizes, so that each row takes a similar time.
        let iters = o.iters * (64 / mib as u32).clamp(1, 8);
        let times = time_modes(comm, wires.len(), iters, |m| {
            let op = match wires[m] {
                None => Op::AllReduce { send: s, recv: r, count: n, dt, op },
                Some(wire) => Op::AllReduceCompressed { send: s, recv: r, count: n, dt, wire, op },
            };
            // SAFETY: `send` and `recv` hold `count` floats and outlive the blocking call.
            unsafe { comm.submit(op, None) }
        })?;
        if comm.rank() == 0 {
            for (wire, t) in wires.iter().zip(&times) {
                let name = wire.map_or("fp32 (none)".to_string(), |w| w.name().to_string());
                let bw = (mib << 20) as f64 / t / 1e9;
                println!("{:>6} MiB {name:<12} {:>10.2} {bw:>12.3} {:>9.2}", mib, t * 1e3, times[0] / t);
            }
        }
    }
    Ok(())
}

fn run(o: &Options) -> Result<()> {
    let cfg = Config::from_env()?;
    hccn_runtime::log::init(&cfg);
    let comm = Communicator::init_from_env(&LaunchEnv::from_env()?, &cfg)?;
    if o.fusion {
        fusion(&comm, o)?;
    }
    if o.compression {
        compression(&comm, o)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("hccn-fusion-bench: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hccn-fusion-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
