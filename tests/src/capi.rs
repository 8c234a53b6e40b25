//! The collective matrix through the exported C functions, exactly as a C program calls them.

use std::ffi::{c_void, CStr};

use hccn::*;
use hccn_runtime::{Op, Ptr};

use crate::Coll;

/// A communicator handle from the C ABI.
#[derive(Debug)]
pub struct CComm {
    pub comm: *mut hccn_comm,
}

fn last_error() -> String {
    // SAFETY: hccn_get_last_error never returns NULL and the string lives until the next failing call.
    unsafe { CStr::from_ptr(hccn_get_last_error()) }.to_string_lossy().into_owned()
}

/// `Ok` for HCCN_SUCCESS, else the code with this thread's last error message.
pub fn check(code: hccn_result) -> Result<(), (u32, String)> {
    if code == 0 {
        Ok(())
    } else {
        Err((code, last_error()))
    }
}

/// Records a failure in `failures` unless a deliberately bad call returned `want` with a
/// message that mentions `needle`.
pub fn expect_refusal(failures: &mut Vec<String>, what: &str, got: hccn_result, want: hccn_result, needle: &str) {
    let msg = last_error();
    if got != want || !msg.contains(needle) {
        failures.push(format!("{what}: returned {got} ({msg:?}), expected {want} mentioning {needle:?}"));
    }
}

/// Milliseconds since the epoch: a clock that processes of one job can compare.
pub fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

impl CComm {
    /// A blocking fp32 allreduce (`op` an `hccn_reduce_op`) of `send` into `recv`.
    pub fn allreduce_f32(&self, send: &[f32], recv: &mut [f32], op: u32) -> Result<(), (u32, String)> {
        let n = send.len().min(recv.len()) as u64;
        let (s, r) = (send.as_ptr().cast::<c_void>(), recv.as_mut_ptr().cast());
        // SAFETY: both buffers hold `n` floats and outlive the blocking call.
        check(unsafe { hccn_allreduce(s, r, n, 4, op, self.comm, std::ptr::null_mut()) })
    }

    /// The ranks `hccn_comm_failed_ranks` names (at most 64).
    pub fn failed_ranks(&self) -> Vec<u32> {
        let mut ranks = [0u32; 64];
        let mut count = 0u32;
        // SAFETY: capacity matches the array.
        unsafe { hccn_comm_failed_ranks(self.comm, ranks.as_mut_ptr(), 64, &mut count) };
        ranks[..count.min(64) as usize].to_vec()
    }

    /// `hccn_comm_epoch`, or `u64::MAX` if it fails.
    pub fn epoch(&self) -> u64 {
        let mut e = u64::MAX;
        // SAFETY: valid handle and out pointer.
        unsafe { hccn_comm_epoch(self.comm, &mut e) };
        e
    }

    /// `hccn_init_from_env`, as under hccnrun.
    pub fn from_env() -> Result<CComm, (u32, String)> {
        let mut comm = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        check(unsafe { hccn_init_from_env(&mut comm) })?;
        Ok(CComm { comm })
    }
}

/// A worker's start: the world communicator from hccnrun's environment, or exit code 2 with
/// the reason on stderr.
pub fn start_worker() -> Result<CComm, std::process::ExitCode> {
    CComm::from_env().map_err(|(code, msg)| {
        eprintln!("hccn_init_from_env failed with {code}: {msg}");
        std::process::ExitCode::from(2)
    })
}

/// A new stream, or exit code 2 with the reason on stderr.
pub fn new_stream() -> Result<*mut hccn_stream, std::process::ExitCode> {
    let mut stream = std::ptr::null_mut();
    // SAFETY: a valid out pointer.
    check(unsafe { hccn_stream_create(&mut stream) }).map_err(|(code, msg)| {
        eprintln!("hccn_stream_create failed with {code}: {msg}");
        std::process::ExitCode::from(2)
    })?;
    Ok(stream)
}

impl Drop for CComm {
    fn drop(&mut self) {
        // SAFETY: the handle came from the library and is destroyed once.
        unsafe { hccn_comm_destroy(self.comm) };
    }
}

fn v(p: Ptr) -> *mut c_void {
    p.0.cast()
}

impl Coll for CComm {
    fn rank(&self) -> u32 {
        let mut r = u32::MAX;
        // SAFETY: valid handle and out pointer.
        unsafe { hccn_comm_rank(self.comm, &mut r) };
        r
    }

    fn size(&self) -> u32 {
        let mut s = 0;
        // SAFETY: valid handle and out pointer.
        unsafe { hccn_comm_size(self.comm, &mut s) };
        s
    }

    unsafe fn run(&self, op: Op) -> Result<(), (u32, String)> {
        let c = self.comm;
        let s = std::ptr::null_mut();
        // SAFETY: the caller guarantees the buffers; arrays outlive the calls.
        let code = unsafe {
            match op {
                Op::AllReduce { send, recv, count, dt, op } => {
                    hccn_allreduce(v(send), v(recv), count, dt as u32, op as u32, c, s)
                }
                Op::AllReduceCompressed { send, recv, count, dt, wire, op } => {
                    hccn_allreduce_compressed(v(send), v(recv), count, dt as u32, wire as u32, op as u32, c, s)
                }
                Op::Broadcast { buf, count, dt, root } => hccn_broadcast(v(buf), count, dt as u32, root, c, s),
                Op::Reduce { send, recv, count, dt, op, root } => {
                    hccn_reduce(v(send), v(recv), count, dt as u32, op as u32, root, c, s)
                }
                Op::AllGather { send, recv, send_count, dt } => {
                    hccn_allgather(v(send), v(recv), send_count, dt as u32, c, s)
                }
                Op::AllGatherV { send, send_count, recv, recv_counts, displs, dt } => hccn_allgatherv(
                    v(send),
                    send_count,
                    v(recv),
                    recv_counts.as_ptr(),
                    displs.as_ptr(),
                    dt as u32,
                    c,
                    s,
                ),
                Op::ReduceScatter { send, recv, recv_count, dt, op } => {
                    hccn_reduce_scatter(v(send), v(recv), recv_count, dt as u32, op as u32, c, s)
                }
                Op::Gather { send, recv, send_count, dt, root } => {
                    hccn_gather(v(send), v(recv), send_count, dt as u32, root, c, s)
                }
                Op::Scatter { send, recv, recv_count, dt, root } => {
                    hccn_scatter(v(send), v(recv), recv_count, dt as u32, root, c, s)
                }
                Op::AllToAll { send, recv, count_per_rank, dt } => {
                    hccn_alltoall(v(send), v(recv), count_per_rank, dt as u32, c, s)
                }
                Op::AllToAllV { send, send_counts, send_displs, recv, recv_counts, recv_displs, dt } => hccn_alltoallv(
                    v(send),
                    send_counts.as_ptr(),
                    send_displs.as_ptr(),
                    v(recv),
                    recv_counts.as_ptr(),
                    recv_displs.as_ptr(),
                    dt as u32,
                    c,
                    s,
                ),
                Op::Send { buf, count, dt, peer } => hccn_send(v(buf), count, dt as u32, peer, c, s),
                Op::Recv { buf, count, dt, peer } => hccn_recv(v(buf), count, dt as u32, peer, c, s),
                Op::Barrier => hccn_barrier(c, s),
            }
        };
        check(code)
    }
}
