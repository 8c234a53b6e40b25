//! Operations HCCL lacks (gather, AVG, compressed allreduce, reductions of the data types HCCL
//! does not reduce), run on the native side over host copies of the device buffers:
//! `aclrtMemcpy` device to host, the native operation, `aclrtMemcpy` back. Slow but exact; the
//! caller has already waited for the stream's earlier work.

use hccn_runtime::sync::Locked;
use std::ffi::c_void;

use hccn_runtime::{Op, Ptr, Result};

use crate::api::{need, ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE};
use crate::comm::Shared;

/// A device range and its host copy.
struct Staged {
    dev: *mut u8,
    host: Vec<u8>,
}

/// Byte extent of `counts`/`displs` arrays in elements of `es` bytes.
fn extent(counts: &[u64], displs: &[u64], es: usize) -> usize {
    counts.iter().zip(displs).map(|(c, d)| (c + d) as usize * es).max().unwrap_or(0)
}

/// Logs the first staged operation of each kind (HCCN_LOG=info), so that tests can see which
/// operations took this path.
fn first_staged(name: &'static str) {
    static SEEN: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.locked();
    if !seen.contains(&name) {
        seen.push(name);
        tracing::info!("HCCL backend: first staged {name}");
    }
}

/// Runs `op` staged through host memory.
///
/// # Safety
/// The buffers of `op` are valid device memory of the sizes the (already checked) op uses.
pub(crate) unsafe fn run(s: &Shared, op: Op) -> Result<()> {
    first_staged(op.name());
    let api = &s.backend.api;
    let memcpy = need(api.aclrtMemcpy, "aclrtMemcpy")?;
    let (me, n) = (s.native.rank() as usize, s.native.size() as usize);
    let d2h = |dev: Ptr, len: usize| -> Result<Staged> {
        let mut host = vec![0u8; len];
        if len > 0 && !dev.is_null() {
            // SAFETY: public signature; `dev` holds `len` bytes (checked op), `host` is ours.
            let rc = unsafe {
                memcpy(host.as_mut_ptr().cast(), len, dev.0 as *const c_void, len, ACL_MEMCPY_DEVICE_TO_HOST)
            };
            api.acl("aclrtMemcpy (device to host)", rc)?;
        }
        Ok(Staged { dev: dev.0, host })
    };
    let h2d = |st: &Staged| -> Result<()> {
        if st.host.is_empty() || st.dev.is_null() {
            return Ok(());
        }
        // SAFETY: as above, the other way.
        let rc = unsafe {
            memcpy(st.dev.cast(), st.host.len(), st.host.as_ptr().cast(), st.host.len(), ACL_MEMCPY_HOST_TO_DEVICE)
        };
        api.acl("aclrtMemcpy (host to device)", rc)
    };
    // The host pointer standing for device pointer `p`: inside the staged output when the op
    // is in place (p within `out`), else a staged copy of `len` bytes.
    let input = |p: Ptr, len: usize, out: &mut Staged, keep: &mut Vec<Staged>| -> Result<Ptr> {
        let (base, end) = (out.dev as usize, out.dev as usize + out.host.len());
        let a = p.0 as usize;
        if !p.is_null() && a >= base && a + len <= end && !out.host.is_empty() {
            return Ok(Ptr::from_mut(out.host[a - base..].as_mut_ptr()));
        }
        let st = d2h(p, len)?;
        let hp = Ptr::from_const(st.host.as_ptr());
        keep.push(st);
        Ok(if p.is_null() { Ptr::null() } else { hp })
    };
    let mut keep = Vec::new();
    let (host_op, mut out) = match op {
        Op::AllReduce { send, recv, count, dt, op } => {
            let len = count as usize * dt.size();
            let mut out = d2h(recv, len)?;
            let send = input(send, len, &mut out, &mut keep)?;
            let recv = Ptr::from_mut(out.host.as_mut_ptr());
            (Op::AllReduce { send, recv, count, dt, op }, out)
        }
        Op::AllReduceCompressed { send, recv, count, dt, wire, op } => {
            let len = count as usize * dt.size();
            let mut out = d2h(recv, len)?;
            let send = input(send, len, &mut out, &mut keep)?;
            let recv = Ptr::from_mut(out.host.as_mut_ptr());
            (Op::AllReduceCompressed { send, recv, count, dt, wire, op }, out)
        }
        Op::Reduce { send, recv, count, dt, op, root } => {
            let len = count as usize * dt.size();
            let mut out = if me == root as usize {
                d2h(recv, len)?
            } else {
                Staged { dev: std::ptr::null_mut(), host: Vec::new() }
            };
            let send = input(send, len, &mut out, &mut keep)?;
            let recv = if out.host.is_empty() { recv } else { Ptr::from_mut(out.host.as_mut_ptr()) };
            (Op::Reduce { send, recv, count, dt, op, root }, out)
        }
        Op::Gather { send, recv, send_count, dt, root } => {
            let len = send_count as usize * dt.size();
            let mut out = if me == root as usize {
                d2h(recv, len * n)?
            } else {
                Staged { dev: std::ptr::null_mut(), host: Vec::new() }
            };
            let send = input(send, len, &mut out, &mut keep)?;
            let recv = if out.host.is_empty() { recv } else { Ptr::from_mut(out.host.as_mut_ptr()) };
            (Op::Gather { send, recv, send_count, dt, root }, out)
        }
        Op::Broadcast { buf, count, dt, root } => {
            let mut out = d2h(buf, count as usize * dt.size())?;
            (Op::Broadcast { buf: Ptr::from_mut(out.host.as_mut_ptr()), count, dt, root }, out)
        }
        Op::AllGather { send, recv, send_count, dt } => {
            let len = send_count as usize * dt.size();
            let mut out = d2h(recv, len * n)?;
            let send = input(send, len, &mut out, &mut keep)?;
            (Op::AllGather { send, recv: Ptr::from_mut(out.host.as_mut_ptr()), send_count, dt }, out)
        }
        Op::AllGatherV { send, send_count, recv, recv_counts, displs, dt } => {
            let mut out = d2h(recv, extent(&recv_counts, &displs, dt.size()))?;
            let send = input(send, send_count as usize * dt.size(), &mut out, &mut keep)?;
            let recv = Ptr::from_mut(out.host.as_mut_ptr());
            (Op::AllGatherV { send, send_count, recv, recv_counts, displs, dt }, out)
        }
        Op::ReduceScatter { send, recv, recv_count, dt, op } => {
            let len = recv_count as usize * dt.size();
            let mut out = d2h(recv, len)?;
            let send = input(send, len * n, &mut out, &mut keep)?;
            (Op::ReduceScatter { send, recv: Ptr::from_mut(out.host.as_mut_ptr()), recv_count, dt, op }, out)
        }
        Op::Scatter { send, recv, recv_count, dt, root } => {
            let len = recv_count as usize * dt.size();
            let mut out = d2h(recv, len)?;
            let send = if me == root as usize { input(send, len * n, &mut out, &mut keep)? } else { send };
            (Op::Scatter { send, recv: Ptr::from_mut(out.host.as_mut_ptr()), recv_count, dt, root }, out)
        }
        Op::AllToAll { send, recv, count_per_rank, dt } => {
            let len = count_per_rank as usize * dt.size() * n;
            let mut out = d2h(recv, len)?;
            let send = input(send, len, &mut out, &mut keep)?;
            (Op::AllToAll { send, recv: Ptr::from_mut(out.host.as_mut_ptr()), count_per_rank, dt }, out)
        }
        Op::AllToAllV { send, send_counts, send_displs, recv, recv_counts, recv_displs, dt } => {
            let mut out = d2h(recv, extent(&recv_counts, &recv_displs, dt.size()))?;
            let send = input(send, extent(&send_counts, &send_displs, dt.size()), &mut out, &mut keep)?;
            let recv = Ptr::from_mut(out.host.as_mut_ptr());
            (Op::AllToAllV { send, send_counts, send_displs, recv, recv_counts, recv_displs, dt }, out)
        }
        Op::Send { buf, count, dt, peer } => {
            let st = d2h(buf, count as usize * dt.size())?;
            let p = Ptr::from_const(st.host.as_ptr());
            keep.push(st);
            (Op::Send { buf: p, count, dt, peer }, Staged { dev: std::ptr::null_mut(), host: Vec::new() })
        }
        Op::Recv { buf, count, dt, peer } => {
            let mut out = d2h(buf, count as usize * dt.size())?;
            (Op::Recv { buf: Ptr::from_mut(out.host.as_mut_ptr()), count, dt, peer }, out)
        }
        Op::Barrier => (Op::Barrier, Staged { dev: std::ptr::null_mut(), host: Vec::new() }),
    };
    // SAFETY: every pointer in `host_op` points into `out` or `keep`, alive until return.
    unsafe { s.native.submit(host_op, None)? };
    drop(keep);
    h2d(&out)?;
    out.host.clear();
    Ok(())
}
