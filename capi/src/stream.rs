//! Streams and events of API.md.

use std::ffi::c_void;

use hccn_runtime::{Error, ErrorKind, Event, Stream};

use crate::ffi::{guard, ok, out_ptr, write, Table};
use crate::types::{hccn_event, hccn_result, hccn_stream, HCCN_IN_PROGRESS, HCCN_SUCCESS};

pub(crate) static STREAMS: Table<Stream> = Table::new("stream");
static EVENTS: Table<Event> = Table::new("event");

fn progress(done: hccn_runtime::Result<bool>) -> hccn_runtime::Result<hccn_result> {
    Ok(if done? { HCCN_SUCCESS } else { HCCN_IN_PROGRESS })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_stream_create(stream: *mut *mut hccn_stream) -> hccn_result {
    guard(|| {
        let out = out_ptr(stream, "stream")?;
        write(out, STREAMS.insert(Stream::new()?));
        ok()
    })
}

/// Waits for the stream's queued work, then frees it.
#[no_mangle]
pub unsafe extern "C" fn hccn_stream_destroy(stream: *mut hccn_stream) -> hccn_result {
    guard(|| {
        let s = STREAMS.remove(stream, "stream")?;
        // The error of the queued work, if any, is still reported.
        let result = s.synchronize();
        drop(s);
        result?;
        ok()
    })
}

/// Waits for everything queued; returns the first error of queued work, if any.
#[no_mangle]
pub unsafe extern "C" fn hccn_stream_synchronize(stream: *mut hccn_stream) -> hccn_result {
    guard(|| {
        STREAMS.get(stream, "stream")?.synchronize()?;
        ok()
    })
}

/// HCCN_SUCCESS when all queued work is done, HCCN_IN_PROGRESS while some is pending, or the error.
#[no_mangle]
pub unsafe extern "C" fn hccn_stream_query(stream: *mut hccn_stream) -> hccn_result {
    guard(|| progress(STREAMS.get(stream, "stream")?.query()))
}

#[no_mangle]
pub unsafe extern "C" fn hccn_event_create(event: *mut *mut hccn_event) -> hccn_result {
    guard(|| {
        let out = out_ptr(event, "event")?;
        write(out, EVENTS.insert(Event::new()));
        ok()
    })
}

/// Marks the work queued on `stream` so far (NULL stream: complete at once).
#[no_mangle]
pub unsafe extern "C" fn hccn_event_record(event: *mut hccn_event, stream: *mut hccn_stream) -> hccn_result {
    guard(|| {
        let ev = EVENTS.get(event, "event")?;
        let s = if stream.is_null() { None } else { Some(STREAMS.get(stream, "stream")?) };
        ev.record(s.as_deref());
        ok()
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_event_query(event: *mut hccn_event) -> hccn_result {
    guard(|| progress(EVENTS.get(event, "event")?.query()))
}

#[no_mangle]
pub unsafe extern "C" fn hccn_event_synchronize(event: *mut hccn_event) -> hccn_result {
    guard(|| {
        EVENTS.get(event, "event")?.synchronize()?;
        ok()
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_event_destroy(event: *mut hccn_event) -> hccn_result {
    guard(|| {
        EVENTS.remove(event, "event")?;
        ok()
    })
}

/// Wraps an `aclrtStream`: ACL streams exist only on the HCCL backend.
#[no_mangle]
pub unsafe extern "C" fn hccn_stream_wrap_acl(acl_stream: *mut c_void, stream: *mut *mut hccn_stream) -> hccn_result {
    guard(|| {
        out_ptr(stream, "stream")?;
        if acl_stream.is_null() {
            return Err(Error::null("acl_stream is NULL"));
        }
        Err(Error::new(
            ErrorKind::NotSupported,
            "hccn_stream_wrap_acl needs the HCCL backend; this process runs the native backend, whose streams come from hccn_stream_create",
        ))
    })
}
