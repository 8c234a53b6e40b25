//! Bad input through the C ABI: each case returns its code with a message naming the problem,
//! writes nothing, and the communicator keeps working.

// Each call below hands the library deliberately bad arguments (or live buffers); that the
// library must reject them without touching memory is what this file tests.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};

use hccn::*;

const FP32: u32 = 4;
const SUM: u32 = 0;
const NULL_POINTER: u32 = 2;
const INVALID: u32 = 1;
const NOT_SUPPORTED: u32 = 5;

fn last_error() -> String {
    // SAFETY: never NULL, valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(hccn_get_last_error()) }.to_string_lossy().into_owned()
}

fn single_rank() -> *mut hccn_comm {
    let mut id = hccn_unique_id { internal: [0; 128] };
    let mut comm = null_mut();
    // SAFETY: valid out pointers; a world of one.
    unsafe {
        assert_eq!(hccn_get_unique_id(&mut id), 0, "{}", last_error());
        assert_eq!(hccn_comm_init_rank(&mut comm, 1, &id, 0), 0, "{}", last_error());
    }
    comm
}

fn allreduce_works(comm: *mut hccn_comm) {
    let x = [1.5f32, 2.5];
    let mut y = [0f32; 2];
    // SAFETY: live buffers of two floats.
    let r = unsafe { hccn_allreduce(x.as_ptr().cast(), y.as_mut_ptr().cast(), 2, FP32, SUM, comm, null_mut()) };
    assert_eq!((r, y), (0, x), "the communicator must still work: {}", last_error());
}

#[test]
fn table_of_bad_calls() {
    let comm = single_rank();
    let buf = [0f32; 16];
    let mut out = [0f32; 16];
    let (s, r) = (buf.as_ptr().cast::<c_void>(), out.as_mut_ptr().cast::<c_void>());
    let mut stream = null_mut();
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { hccn_stream_create(&mut stream) }, 0);
    let mut size = 0u32;
    let mut fresh_id = hccn_unique_id { internal: [0; 128] };
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { hccn_get_unique_id(&mut fresh_id) }, 0);
    // SAFETY (every case): pointers are live buffers, NULL, or deliberately wrong handles that the
    // library must reject before touching them.
    type Case = (&'static str, u32, &'static str, Box<dyn Fn() -> u32>);
    let cases: Vec<Case> = vec![
        (
            "null sendbuf",
            NULL_POINTER,
            "sendbuf",
            Box::new(move || unsafe { hccn_allreduce(null(), r, 4, FP32, SUM, comm, null_mut()) }),
        ),
        (
            "null recvbuf",
            NULL_POINTER,
            "recvbuf",
            Box::new(move || unsafe { hccn_allreduce(s, null_mut(), 4, FP32, SUM, comm, null_mut()) }),
        ),
        (
            "null comm",
            NULL_POINTER,
            "comm",
            Box::new(move || unsafe { hccn_allreduce(s, r, 4, FP32, SUM, null_mut(), null_mut()) }),
        ),
        (
            "unknown dtype",
            INVALID,
            "data type 99",
            Box::new(move || unsafe { hccn_allreduce(s, r, 4, 99, SUM, comm, null_mut()) }),
        ),
        (
            "unknown op",
            INVALID,
            "reduce op 7",
            Box::new(move || unsafe { hccn_allreduce(s, r, 4, FP32, 7, comm, null_mut()) }),
        ),
        (
            "overflowing count",
            INVALID,
            "overflows",
            Box::new(move || unsafe { hccn_allreduce(s, r, u64::MAX / 2, FP32, SUM, comm, null_mut()) }),
        ),
        (
            "partial overlap",
            INVALID,
            "overlap",
            Box::new(move || unsafe {
                hccn_allreduce(s, (s as *mut f32).wrapping_add(1).cast(), 4, FP32, SUM, comm, null_mut())
            }),
        ),
        (
            "root out of range",
            INVALID,
            "root 1",
            Box::new(move || unsafe { hccn_broadcast(r, 4, FP32, 1, comm, null_mut()) }),
        ),
        (
            "peer out of range",
            INVALID,
            "peer 3",
            Box::new(move || unsafe { hccn_send(s, 4, FP32, 3, comm, null_mut()) }),
        ),
        (
            "alltoall in place",
            INVALID,
            "no in-place",
            Box::new(move || unsafe { hccn_alltoall(r, r, 4, FP32, comm, null_mut()) }),
        ),
        (
            "null recvcounts",
            NULL_POINTER,
            "recvcounts",
            Box::new(move || unsafe { hccn_allgatherv(s, 1, r, null(), null(), FP32, comm, null_mut()) }),
        ),
        (
            "stream handle as comm",
            INVALID,
            "not a live communicator",
            Box::new(move || unsafe { hccn_barrier(stream.cast(), null_mut()) }),
        ),
        (
            "comm handle as stream",
            INVALID,
            "not a live stream",
            Box::new(move || unsafe { hccn_barrier(comm, comm.cast()) }),
        ),
        ("null size out", NULL_POINTER, "size", Box::new(move || unsafe { hccn_comm_size(comm, null_mut()) })),
        ("null version out", NULL_POINTER, "version", Box::new(|| unsafe { hccn_get_version(null_mut()) })),
        (
            "empty group",
            INVALID,
            "nranks is 0",
            Box::new(move || unsafe { hccn_new_group(comm, null(), 0, &mut null_mut()) }),
        ),
        (
            "group without caller",
            INVALID,
            "out of range",
            Box::new(move || unsafe { hccn_new_group(comm, [5u32].as_ptr(), 1, &mut null_mut()) }),
        ),
        (
            "init with nranks 0",
            INVALID,
            "nranks 0",
            Box::new(move || unsafe { hccn_comm_init_rank(&mut null_mut(), 0, &fresh_id, 0) }),
        ),
        (
            "init with rank >= nranks",
            INVALID,
            "rank 2",
            Box::new(move || unsafe { hccn_comm_init_rank(&mut null_mut(), 2, &fresh_id, 2) }),
        ),
        (
            "garbage unique id",
            INVALID,
            "unique id",
            Box::new(|| unsafe { hccn_comm_init_rank(&mut null_mut(), 2, &hccn_unique_id { internal: [7; 128] }, 0) }),
        ),
        ("mem alloc to NULL", NULL_POINTER, "ptr", Box::new(|| unsafe { hccn_mem_alloc(null_mut(), 64) })),
        ("mem alloc of 0 bytes", INVALID, "0 bytes", Box::new(|| unsafe { hccn_mem_alloc(&mut null_mut(), 0) })),
        ("mem free of heap memory", INVALID, "hccn_mem_alloc", Box::new(move || unsafe { hccn_mem_free(r) })),
        (
            "acl stream on native",
            NOT_SUPPORTED,
            "HCCL backend",
            Box::new(|| unsafe { hccn_stream_wrap_acl(8usize as *mut c_void, &mut null_mut()) }),
        ),
    ];
    for (what, want, needle, call) in &cases {
        let got = call();
        let msg = last_error();
        assert_eq!(got, *want, "{what}: code (message: {msg})");
        assert!(msg.contains(needle), "{what}: message {msg:?} does not mention {needle:?}");
        allreduce_works(comm);
    }
    // Outputs are written only on success.
    // SAFETY: `size` is a live u32; the handle is deliberately invalid.
    assert_eq!(unsafe { hccn_comm_size(stream.cast(), &mut size) }, INVALID);
    assert_eq!(size, 0, "an output was written by a failing call");
    // SAFETY: handles from the library, destroyed once; then used again on purpose.
    unsafe {
        assert_eq!(hccn_stream_destroy(stream), 0);
        assert_eq!(hccn_stream_query(stream), INVALID, "destroyed stream: {}", last_error());
        assert_eq!(hccn_comm_destroy(null_mut()), 0, "destroy(NULL) is a no-op");
        assert_eq!(hccn_comm_destroy(comm), 0);
        assert_eq!(hccn_barrier(comm, null_mut()), INVALID, "destroyed comm: {}", last_error());
        assert!(last_error().contains("destroyed"));
        assert!(!CStr::from_ptr(hccn_get_error_string(12345)).to_bytes().is_empty());
    }
}

#[test]
fn shareable_memory_is_zeroed_usable_and_freed_once() {
    let comm = single_rank();
    let mut p: *mut c_void = null_mut();
    // SAFETY: a valid out pointer; the memory is used within its 4096 bytes, then freed once and
    // handed back again on purpose.
    unsafe {
        assert_eq!(hccn_mem_alloc(&mut p, 4096), 0, "{}", last_error());
        let f = std::slice::from_raw_parts_mut(p.cast::<f32>(), 1024);
        assert!(f.iter().all(|x| *x == 0.0), "zeroed");
        f.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
        assert_eq!(hccn_allreduce(p, p, 1024, FP32, SUM, comm, null_mut()), 0, "{}", last_error());
        assert_eq!(f[1023], 1023.0);
        assert_eq!(hccn_mem_free(p), 0, "{}", last_error());
        assert_eq!(hccn_mem_free(p), INVALID, "freed twice");
        assert!(last_error().contains("freed already"), "{}", last_error());
        assert_eq!(hccn_mem_free(null_mut()), 0, "free(NULL) is a no-op");
        assert_eq!(hccn_comm_destroy(comm), 0);
    }
}

#[test]
fn only_hccn_symbols_are_exported() {
    let lib = hccn_tests::launch::bin_dir().join("libhccn.so");
    let out = std::process::Command::new("nm").args(["-D", "--defined-only"]).arg(&lib).output().expect("run nm");
    assert!(out.status.success(), "nm failed on {}", lib.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
    assert!(names.contains(&"hccn_allreduce"), "no hccn_allreduce in {}", lib.display());
    let foreign: Vec<&&str> = names.iter().filter(|n| !n.starts_with("hccn_")).collect();
    assert!(foreign.is_empty(), "libhccn.so exports non-hccn symbols: {foreign:?}");
}
