//! `hccn_stream_add_callback` through the C ABI: called once per successful call, on the
//! stream's thread, after the work queued before it, with the caller's data; bad input refused.
//! (The status after a failure is covered by the runtime's stream tests and, end to end, by the
//! torch backend's tests, whose futures complete through it.)

#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::sync::Mutex;

use hccn::*;

const FP32: u32 = 4;
const SUM: u32 = 0;

fn last_error() -> String {
    // SAFETY: never NULL, valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(hccn_get_last_error()) }.to_string_lossy().into_owned()
}

/// What each callback saw: its status, the first value of the reduced buffer, its thread.
struct Seen {
    calls: Mutex<Vec<(u32, f32, std::thread::ThreadId)>>,
    buf: *const f32,
}

unsafe extern "C" fn record(status: u32, user_data: *mut c_void) {
    // SAFETY: user_data is the `Seen` the test keeps alive until the stream is destroyed.
    let seen = unsafe { &*(user_data as *const Seen) };
    // SAFETY: the buffer the allreduce queued before this callback wrote, alive as long as `seen`.
    let first = unsafe { *seen.buf };
    seen.calls.lock().expect("lock").push((status, first, std::thread::current().id()));
}

#[test]
fn callbacks_run_once_in_order_on_the_stream_thread_after_the_work_before_them() {
    let mut id = hccn_unique_id { internal: [0; 128] };
    let (mut comm, mut stream) = (null_mut(), null_mut());
    // Operation k writes k + 1 into `buf`: callback k must see exactly that value.
    let srcs: Vec<Vec<f32>> = (1..=3).map(|k| vec![k as f32; 1 << 16]).collect();
    let mut buf = vec![0.0f32; 1 << 16];
    let seen = Seen { calls: Mutex::new(Vec::new()), buf: buf.as_ptr() };
    let data = &seen as *const Seen as *mut c_void;
    unsafe {
        assert_eq!(hccn_get_unique_id(&mut id), 0, "{}", last_error());
        assert_eq!(hccn_comm_init_rank(&mut comm, 1, &id, 0), 0, "{}", last_error());
        assert_eq!(hccn_stream_create(&mut stream), 0, "{}", last_error());
        for src in &srcs {
            let (s, r) = (src.as_ptr().cast(), buf.as_mut_ptr().cast());
            assert_eq!(hccn_allreduce(s, r, buf.len() as u64, FP32, SUM, comm, stream), 0, "{}", last_error());
            assert_eq!(hccn_stream_add_callback(stream, Some(record), data), 0, "{}", last_error());
        }
        assert_eq!(hccn_stream_add_callback(stream, None, data), 2, "a NULL callback is refused");
        assert!(last_error().contains("callback"), "{}", last_error());
        // Destroying the stream waits for the queue, callbacks included.
        assert_eq!(hccn_stream_destroy(stream), 0, "{}", last_error());
        assert_eq!(hccn_stream_add_callback(stream, Some(record), data), 1, "a destroyed stream is refused");
        assert_eq!(hccn_comm_destroy(comm), 0);
    }
    let calls = seen.calls.lock().expect("lock").clone();
    assert_eq!(calls.len(), 3, "one call per successful hccn_stream_add_callback: {calls:?}");
    let values: Vec<f32> = calls.iter().map(|c| c.1).collect();
    assert_eq!(values, [1.0, 2.0, 3.0], "each after its own operation, in order: {calls:?}");
    assert!(calls.iter().all(|c| c.0 == 0), "status: {calls:?}");
    let main = std::thread::current().id();
    assert!(calls.iter().all(|c| c.2 != main && c.2 == calls[0].2), "the stream's own thread: {calls:?}");
    drop(buf);
}
