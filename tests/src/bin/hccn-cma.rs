//! Collectives whose chunks straddle and exceed the single-copy (CMA) threshold, printing a hash
//! of every result's bits, so that a test can compare HCCN_CMA=off with auto bit for bit.
//! Allgather (also in place, and allgatherv), broadcast, alltoall, gather and scatter results
//! are also checked exactly. Usage: hccnrun -n N
//! hccn-cma [--register]; with `--register` every buffer comes from `hccn_mem_alloc` (peers map
//! it rather than read it with process_vm_readv). Prints `HASH op=.. count=.. bits=..` per
//! operation and `WRONG n` at the end.

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

/// `len` floats of shareable memory (`hccn_mem_alloc`), freed on drop.
struct Shared(*mut f32, usize);

impl std::ops::Deref for Shared {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: hccn_mem_alloc returned at least `len` floats, zeroed, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.0, self.1) }
    }
}

impl std::ops::DerefMut for Shared {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.0, self.1) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: allocated by hccn_mem_alloc, no operation uses it any more.
        unsafe { hccn_mem_free(self.0.cast()) };
    }
}

type Buf = Box<dyn std::ops::DerefMut<Target = [f32]>>;

/// `len` zeroed floats from the heap, or shareable memory with `register`.
fn buffer(len: usize, register: bool) -> Result<Buf, (u32, String)> {
    if !register {
        return Ok(Box::new(vec![0f32; len]));
    }
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out pointer; at least one float so that the size is never 0.
    check(unsafe { hccn_mem_alloc(&mut p, (len.max(1) * 4) as u64) })?;
    Ok(Box::new(Shared(p.cast(), len)))
}

fn run(c: &CComm, count: usize, register: bool) -> Result<usize, (u32, String)> {
    let (me, n) = (c.rank(), c.size() as usize);
    let mut send = buffer(count, register)?;
    send.iter_mut().enumerate().for_each(|(j, x)| *x = value(me, j));
    let mut recv = buffer(count, register)?;
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
    let mut rs = buffer(block, register)?;
    // SAFETY: send holds n * block floats or more, rs holds block.
    check(unsafe { hccn_reduce_scatter(send.as_ptr().cast(), out(&mut rs), block as u64, FP32, SUM, c.comm, s) })?;
    println!("HASH op=reduce_scatter count={count} bits={:016x}", hash(&rs));
    let mut all = buffer(block * n, register)?;
    // SAFETY: send holds at least block floats, all holds n * block.
    check(unsafe { hccn_allgather(send.as_ptr().cast(), out(&mut all), block as u64, FP32, c.comm, s) })?;
    println!("HASH op=allgather count={count} bits={:016x}", hash(&all));
    let b = block.max(1);
    let wrong = all.iter().enumerate().filter(|(i, v)| **v != value((i / b) as u32, i % b)).count();
    Ok(wrong + broadcast(c, count, register)? + allgathers(c, block, register)? + gathering(c, block, &send, register)?)
}

/// Broadcast of `count` floats from the middle rank; returns the wrong elements.
fn broadcast(c: &CComm, count: usize, register: bool) -> Result<usize, (u32, String)> {
    let (me, root) = (c.rank(), c.size() / 2);
    let mut buf = buffer(count, register)?;
    if me == root {
        buf.iter_mut().enumerate().for_each(|(j, x)| *x = value(root, j));
    }
    // SAFETY: buf holds `count` floats and outlives the blocking call.
    check(unsafe { hccn_broadcast(buf.as_mut_ptr().cast(), count as u64, FP32, root, c.comm, std::ptr::null_mut()) })?;
    println!("HASH op=broadcast count={count} bits={:016x}", hash(&buf));
    Ok(buf.iter().enumerate().filter(|(j, v)| **v != value(root, *j)).count())
}

/// Allgather in place and allgatherv of uneven blocks placed in reverse rank order (on one
/// host each rank reads every block from its owner); returns the wrong elements.
fn allgathers(c: &CComm, block: usize, register: bool) -> Result<usize, (u32, String)> {
    let (me, n) = (c.rank() as usize, c.size() as usize);
    let s = std::ptr::null_mut();
    let mut all = buffer(block * n, register)?;
    all[me * block..(me + 1) * block].iter_mut().enumerate().for_each(|(j, x)| *x = value(me as u32, j));
    let own = all[me * block..].as_ptr().cast::<c_void>();
    // SAFETY: in place: the input is this rank's block of `all`, which holds n * block floats.
    check(unsafe { hccn_allgather(own, all.as_mut_ptr().cast(), block as u64, FP32, c.comm, s) })?;
    println!("HASH op=allgather_in_place count={block} bits={:016x}", hash(&all));
    let b = block.max(1);
    let mut wrong = all.iter().enumerate().filter(|(i, v)| **v != value((i / b) as u32, i % b)).count();
    // Rank i's block: 13 i floats longer than `block`, the last rank's first in the output.
    let counts: Vec<u64> = (0..n).map(|i| (block + 13 * i) as u64).collect();
    let mut displs = vec![0u64; n];
    let mut at = 0;
    for i in (0..n).rev() {
        displs[i] = at;
        at += counts[i];
    }
    let mut mine = buffer(counts[me] as usize, register)?;
    mine.iter_mut().enumerate().for_each(|(j, x)| *x = value(me as u32, j));
    let mut allv = buffer(at as usize, register)?;
    // SAFETY: `mine` holds counts[me] floats; allv holds the sum of counts, placed by displs.
    check(unsafe {
        hccn_allgatherv(
            mine.as_ptr().cast(),
            counts[me],
            allv.as_mut_ptr().cast(),
            counts.as_ptr(),
            displs.as_ptr(),
            FP32,
            c.comm,
            s,
        )
    })?;
    println!("HASH op=allgatherv count={block} bits={:016x}", hash(&allv));
    for i in 0..n {
        let got = &allv[displs[i] as usize..(displs[i] + counts[i]) as usize];
        wrong += got.iter().enumerate().filter(|(j, v)| **v != value(i as u32, *j)).count();
    }
    Ok(wrong)
}

/// Alltoall, gather to the last rank and scatter from rank 0 of `block` floats per rank, whose
/// large blocks the receiver reads straight from the sender; returns the wrong elements.
fn gathering(c: &CComm, block: usize, send: &[f32], register: bool) -> Result<usize, (u32, String)> {
    let (me, n) = (c.rank() as usize, c.size() as usize);
    let (b, count, s) = (block.max(1), block as u64, std::ptr::null_mut());
    let out = |p: &mut [f32]| p.as_mut_ptr().cast::<c_void>();
    let mut a2a = buffer(block * n, register)?;
    // SAFETY: send holds at least n * block floats, a2a n * block.
    check(unsafe { hccn_alltoall(send.as_ptr().cast(), out(&mut a2a), count, FP32, c.comm, s) })?;
    println!("HASH op=alltoall count={block} bits={:016x}", hash(&a2a));
    // Block i came from rank i: its block for this rank.
    let mut wrong = a2a.iter().enumerate().filter(|(i, v)| **v != value((i / b) as u32, me * block + i % b)).count();
    let root = n - 1;
    let mut gathered = buffer(block * n, register)?;
    // SAFETY: send holds at least block floats, gathered n * block (read on the root only).
    check(unsafe { hccn_gather(send.as_ptr().cast(), out(&mut gathered), count, FP32, root as u32, c.comm, s) })?;
    println!("HASH op=gather count={block} bits={:016x}", hash(&gathered));
    if me == root {
        wrong += gathered.iter().enumerate().filter(|(i, v)| **v != value((i / b) as u32, i % b)).count();
    }
    let mut part = buffer(block, register)?;
    // SAFETY: send holds at least n * block floats (read on rank 0 only), part holds block.
    check(unsafe { hccn_scatter(send.as_ptr().cast(), out(&mut part), count, FP32, 0, c.comm, s) })?;
    println!("HASH op=scatter count={block} bits={:016x}", hash(&part));
    wrong += part.iter().enumerate().filter(|(j, v)| **v != value(0, me * block + j)).count();
    Ok(wrong)
}

fn main() -> ExitCode {
    let comm = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let n = comm.size() as usize;
    let register = std::env::args().any(|a| a == "--register");
    // Segments just below and above 64 KiB, odd counts, and chunks far above the threshold.
    let counts = [5, n * 16384 - 1, n * 16384 + 3, n * 65536 + 7, 1_000_003, 3_000_017];
    let mut wrong = 0;
    for count in counts {
        match run(&comm, count, register) {
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
