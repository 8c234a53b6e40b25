//! A rank on the HCCL backend using its own ACL stream through `hccn_stream_wrap_acl`, with
//! host buffers standing for device memory, filled with `aclrtMemcpy` (the hccl-emu test
//! double: docs/hccl.md). Prints `[r] STREAMS ok` or `FAIL ...` lines. Usage: HCCN_BACKEND=hccl HCCN_HCCL_LIB=.. HCCN_ACL_LIB=..
//! hccnrun -n N hccn-hccl-streams

use std::ffi::c_void;
use std::process::ExitCode;

use hccn::*;
use hccn_backend_hccl::api::{ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE};
use hccn_backend_hccl::Api;
use hccn_tests::capi::check;
use hccn_tests::Coll;

const N: usize = 1000;

fn main() -> ExitCode {
    let comm = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (me, n) = (comm.rank(), comm.size());
    let mut fails = Vec::new();
    if let Err(e) = run(comm.comm, me, n, &mut fails) {
        fails.push(e);
    }
    for f in &fails {
        println!("FAIL {f}");
    }
    if fails.is_empty() {
        println!("STREAMS ok rank {me} of {n}");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn need<T>(o: Option<T>, name: &str) -> Result<T, String> {
    o.ok_or_else(|| format!("the ACL library lacks {name}"))
}

fn run(comm: *mut hccn_comm, me: u32, n: u32, fails: &mut Vec<String>) -> Result<(), String> {
    let cfg = hccn_runtime::Config::from_env().map_err(|e| e.to_string())?;
    // The same libraries the backend loaded (dlopen hands out the loaded copy).
    let api = Api::load(&cfg).map_err(|e| e.to_string())?;
    let (create, sync, destroy) = (
        need(api.aclrtCreateStream, "aclrtCreateStream")?,
        need(api.aclrtSynchronizeStream, "aclrtSynchronizeStream")?,
        need(api.aclrtDestroyStream, "aclrtDestroyStream")?,
    );
    let memcpy = need(api.aclrtMemcpy, "aclrtMemcpy")?;
    let bytes = N * 4;
    let mut raw: *mut c_void = std::ptr::null_mut();
    // SAFETY: public ACL signatures with valid pointers; the buffers are ours (host memory
    // standing for device memory in the double) and outlive every operation on them.
    unsafe {
        if create(&mut raw) != 0 {
            return Err("aclrtCreateStream failed".into());
        }
        let mut dev: Vec<Vec<f32>> = vec![vec![0f32; N]; 3];
        let host: Vec<f32> = (0..N).map(|i| (me as usize * N + i) as f32).collect();
        let (send, recv, all) = (dev[0].as_mut_ptr(), dev[1].as_mut_ptr(), dev[2].as_mut_ptr());
        let mut gathered = vec![0f32; N * n as usize];
        let to_dev = memcpy(send.cast(), bytes, host.as_ptr().cast(), bytes, ACL_MEMCPY_HOST_TO_DEVICE);
        if to_dev != 0 {
            return Err("aclrtMemcpy host to device failed".into());
        }
        let mut s = std::ptr::null_mut();
        check(hccn_stream_wrap_acl(raw, &mut s)).map_err(|(c, m)| format!("wrap: {c} {m}"))?;
        let mut ev = std::ptr::null_mut();
        check(hccn_event_create(&mut ev)).map_err(|(c, m)| format!("event: {c} {m}"))?;
        // An HCCL operation, then one that HCCL lacks (staged), both on the caller's stream.
        let steps = [
            ("allreduce", hccn_allreduce(send.cast(), recv.cast(), N as u64, 4, 0, comm, s)),
            ("record", hccn_event_record(ev, s)),
            ("gather", hccn_gather(send.cast(), gathered.as_mut_ptr().cast(), N as u64, 4, 0, comm, s)),
            ("allgather", hccn_allgather(send.cast(), all.cast(), N as u64 / 3, 4, comm, s)),
            ("event sync", hccn_event_synchronize(ev)),
            ("stream sync", hccn_stream_synchronize(s)),
        ];
        for (what, rc) in steps {
            if let Err((c, m)) = check(rc) {
                fails.push(format!("rank {me}: {what} returned {c}: {m}"));
            }
        }
        let mut out = vec![0f32; N];
        if memcpy(out.as_mut_ptr().cast(), bytes, recv.cast(), bytes, ACL_MEMCPY_DEVICE_TO_HOST) != 0 {
            fails.push("aclrtMemcpy device to host failed".into());
        }
        for (i, v) in out.iter().enumerate() {
            let want: f32 = (0..n).map(|r| (r as usize * N + i) as f32).sum();
            if *v != want {
                fails.push(format!("rank {me}: allreduce element {i} is {v}, want {want}"));
                break;
            }
        }
        if me == 0 {
            if let Some(i) = (0..N * n as usize).find(|&i| gathered[i] != i as f32) {
                fails.push(format!("rank 0: gather element {i} is {}", gathered[i]));
            }
        }
        let third = N / 3;
        for r in 0..n as usize {
            for i in 0..third {
                if dev[2][r * third + i] != (r * N + i) as f32 {
                    fails.push(format!("rank {me}: allgather block {r} element {i} is {}", dev[2][r * third + i]));
                    break;
                }
            }
        }
        let _ = hccn_event_destroy(ev);
        if let Err((c, m)) = check(hccn_stream_destroy(s)) {
            fails.push(format!("rank {me}: hccn_stream_destroy returned {c}: {m}"));
        }
        // hccn destroyed its wrapper only: the caller's stream still works and is theirs to destroy.
        if sync(raw) != 0 || destroy(raw) != 0 {
            fails.push(format!("rank {me}: the wrapped ACL stream was not left to its owner"));
        }
        drop(dev);
    }
    Ok(())
}
