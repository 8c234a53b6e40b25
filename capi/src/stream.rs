//! Streams and events of docs/c-api.md.

use std::ffi::c_void;

use hccn_runtime::{AnyStream, Error, Event};

use crate::error::fail;
use crate::ffi::{guard, ok, out_ptr, write, Table};
use crate::types::{hccn_event, hccn_result, hccn_stream, hccn_stream_callback, HCCN_IN_PROGRESS, HCCN_SUCCESS};

pub(crate) static STREAMS: Table<AnyStream> = Table::new("stream");
static EVENTS: Table<Event> = Table::new("event");

fn progress(done: hccn_runtime::Result<bool>) -> hccn_runtime::Result<hccn_result> {
    Ok(if done? { HCCN_SUCCESS } else { HCCN_IN_PROGRESS })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_stream_create(stream: *mut *mut hccn_stream) -> hccn_result {
    guard(|| {
        let out = out_ptr(stream, "stream")?;
        write(out, STREAMS.insert(AnyStream::new(&crate::config()?)?));
        ok()
    })
}

/// Waits for the stream's queued work, then frees it.
#[no_mangle]
pub unsafe extern "C" fn hccn_stream_destroy(stream: *mut hccn_stream) -> hccn_result {
    guard(|| {
        // In a forked child the parent's stream (whose worker is the parent's) is let go of.
        let Some(s) = STREAMS.remove(stream, "stream")? else {
            return ok();
        };
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

/// The caller's `user_data`, handed to its callback on the stream's worker thread.
struct UserData(*mut c_void);

// SAFETY: hccn never dereferences it; hccn_stream_add_callback's caller promises that its
// callback may be called with it from the stream's thread.
unsafe impl Send for UserData {}

impl UserData {
    fn get(&self) -> *mut c_void {
        self.0
    }
}

/// Calls `callback(status, user_data)` on the stream's thread once everything queued before it
/// has finished; `status` is HCCN_SUCCESS or the stream's first error, whose message
/// `hccn_get_last_error()` returns inside the callback. It is called exactly once whenever this
/// returns HCCN_SUCCESS: also on a stream that has already failed, and before
/// `hccn_stream_destroy` returns. The callback must not wait for work of the same stream.
#[no_mangle]
pub unsafe extern "C" fn hccn_stream_add_callback(
    stream: *mut hccn_stream,
    callback: hccn_stream_callback,
    user_data: *mut c_void,
) -> hccn_result {
    guard(|| {
        let s = STREAMS.get(stream, "stream")?;
        let f = callback.ok_or_else(|| Error::null("callback is NULL"))?;
        // On an ACL stream the callback comes after the device work queued so far. If the host
        // queue has failed, that wait is not queued and the callback gets the error.
        let _ = s.host_after_device();
        let data = UserData(user_data);
        s.host.enqueue_callback(Box::new(move |status| {
            let code = match status {
                Ok(()) => HCCN_SUCCESS,
                Err(e) => fail(&e),
            };
            // SAFETY: a non-NULL function of the header's callback type, called once with the
            // caller's own data, as hccn_stream_add_callback documents.
            unsafe { f(code, data.get()) }
        }))?;
        ok()
    })
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
        // On an ACL stream the host queue first waits for the device work queued so far.
        if let Some(st) = s.as_ref() {
            st.host_after_device()?;
        }
        ev.record(s.as_deref().map(|s| &s.host));
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

/// Wraps the caller's `aclrtStream` (HCCL backend only): operations on the returned stream are
/// issued to HCCL on it and return at once; destroying the wrapper leaves the ACL stream alone.
#[no_mangle]
pub unsafe extern "C" fn hccn_stream_wrap_acl(acl_stream: *mut c_void, stream: *mut *mut hccn_stream) -> hccn_result {
    guard(|| {
        let out = out_ptr(stream, "stream")?;
        if acl_stream.is_null() {
            return Err(Error::null("acl_stream is NULL"));
        }
        // SAFETY: the caller passes a live aclrtStream that outlives the wrapper.
        let wrapped = unsafe { AnyStream::wrap(&crate::config()?, acl_stream)? };
        write(out, STREAMS.insert(wrapped));
        ok()
    })
}
