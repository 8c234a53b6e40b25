//! A rank that forks after init, as a data-loading worker pool does: the child must be refused
//! every use of the parent's communicator and stream (never sending on the parent's links), may
//! destroy them without harm to the parent, and may start a job of its own; the parent's
//! collectives go on exactly. Prints `CHILD <what> ...` and `PARENT <what> ...` lines (read by
//! tests/tests/lifecycle.rs) and exits 1 when anything is wrong.

use std::ffi::CStr;
use std::process::ExitCode;

use hccn::*;
use hccn_tests::capi::{check, CComm};

const INVALID: u32 = 1;

/// An allreduce of 16 fp32 values `base + rank + j`; whether the sum is exact.
fn exact(c: *mut hccn_comm, stream: *mut hccn_stream, base: f32) -> Result<bool, (u32, String)> {
    let (mut rank, mut n) = (0u32, 0u32);
    // SAFETY: valid out pointers; a bad handle is an error, not a crash.
    check(unsafe { hccn_comm_rank(c, &mut rank) })?;
    // SAFETY: as above.
    check(unsafe { hccn_comm_size(c, &mut n) })?;
    let send: Vec<f32> = (0..16).map(|j| base + rank as f32 + j as f32).collect();
    let mut recv = vec![0f32; 16];
    // SAFETY: 16 floats each, kept until the stream (if any) is synchronised below.
    check(unsafe { hccn_allreduce(send.as_ptr().cast(), recv.as_mut_ptr().cast(), 16, 4, 0, c, stream) })?;
    if !stream.is_null() {
        // SAFETY: a stream handle.
        check(unsafe { hccn_stream_synchronize(stream) })?;
    }
    let n = n as f32;
    Ok(recv.iter().enumerate().all(|(j, v)| *v == n * (base + j as f32) + n * (n - 1.0) / 2.0))
}

fn last_error() -> String {
    // SAFETY: never NULL, valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(hccn_get_last_error()) }.to_string_lossy().into_owned()
}

/// The child's part; returns whether everything was as it must be.
fn child(world: &CComm, stream: *mut hccn_stream) -> bool {
    let mut good = true;
    let mut expect = |what: &str, got: Result<bool, (u32, String)>| {
        let ok = matches!(&got, Err((INVALID, msg)) if msg.contains("forked"));
        good &= ok;
        println!("CHILD {what} {got:?} {}", if ok { "PASS" } else { "FAIL" });
    };
    expect("allreduce-on-inherited", exact(world.comm, std::ptr::null_mut(), 1.0));
    expect("allreduce-on-inherited-stream", exact(world.comm, stream, 1.0));
    let mut rank = u32::MAX;
    // SAFETY: valid out pointer.
    let code = unsafe { hccn_comm_rank(world.comm, &mut rank) };
    let refused = code == INVALID && last_error().contains("forked");
    good &= refused;
    println!("CHILD rank-of-inherited code={code} {}", if refused { "PASS" } else { "FAIL" });
    // Letting go of what the parent owns: success, and nothing of the parent's is touched.
    // SAFETY: handles from the parent; the library lets go of them without using them.
    let (d1, d2) = unsafe { (hccn_stream_destroy(stream), hccn_comm_destroy(world.comm)) };
    good &= d1 == 0 && d2 == 0;
    println!("CHILD destroy-inherited stream={d1} comm={d2} {}", if d1 == 0 && d2 == 0 { "PASS" } else { "FAIL" });
    // A job of its own: one rank through a unique id.
    let mut id = hccn_unique_id { internal: [0; 128] };
    let mut own = std::ptr::null_mut();
    // SAFETY: valid out pointers.
    let made = check(unsafe { hccn_get_unique_id(&mut id) })
        // SAFETY: as above.
        .and_then(|_| check(unsafe { hccn_comm_init_rank(&mut own, 1, &id, 0) }));
    let own_ok = made.is_ok() && exact(own, std::ptr::null_mut(), 5.0) == Ok(true);
    good &= own_ok;
    println!("CHILD own-job {made:?} {}", if own_ok { "PASS" } else { "FAIL" });
    // SAFETY: the child's own communicator.
    unsafe { hccn_comm_destroy(own) };
    good
}

fn main() -> ExitCode {
    let world = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let stream = match hccn_tests::capi::new_stream() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let before = exact(world.comm, std::ptr::null_mut(), 0.0);
    // SAFETY: fork in a program whose other threads are the library's; the child calls only
    // the library and exits with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let good = child(&world, stream);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(if good { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just made.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let child_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    println!("PARENT child-exit status={status} {}", if child_ok { "PASS" } else { "FAIL" });
    // The parent's communicator and stream go on as if nothing happened.
    let after: Vec<_> = (0..20).map(|i| exact(world.comm, std::ptr::null_mut(), 10.0 + i as f32)).collect();
    let on_stream = exact(world.comm, stream, 100.0);
    let parent_ok = before == Ok(true) && after.iter().all(|r| *r == Ok(true)) && on_stream == Ok(true);
    println!(
        "PARENT collectives before={before:?} after={:?} stream={on_stream:?} {}",
        after.iter().find(|r| **r != Ok(true)),
        if parent_ok { "PASS" } else { "FAIL" }
    );
    // SAFETY: the parent's stream.
    unsafe { hccn_stream_destroy(stream) };
    if child_ok && parent_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
