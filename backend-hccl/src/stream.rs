//! ACL streams under hccn streams: created by `hccn_stream_create` on this backend, or the
//! caller's own (`hccn_stream_wrap_acl`). Waiting polls the stream and, meanwhile, the native
//! side of every communicator that issued work on it, so that a dead peer ends the wait (with
//! the HCCL communicator torn down) instead of hanging until HCCL's own execution timeout.
//! Without `aclrtStreamQuery`, `aclrtSynchronizeStream` runs on a helper thread while the
//! caller's thread does that watching; a stream whose wait ended on a failure is abandoned.

use hccn_runtime::sync::Locked;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hccn_runtime::{Error, ErrorKind, Result};

use crate::api::{need, AclStream as RawStream, ACL_STREAM_STATUS_COMPLETE};
use crate::comm::Shared;
use crate::HcclLibrary;

pub struct AclStream {
    backend: Arc<HcclLibrary>,
    raw: usize,
    owned: bool,
    /// Communicators with work on this stream since the last completed wait.
    watched: Mutex<Vec<std::sync::Weak<Shared>>>,
    /// Set when a wait gave up on the stream's tasks without being able to stop them (no
    /// `aclrtStreamQuery`, or no `aclrtDeviceTaskAbort`): a helper thread may still be blocked
    /// in `aclrtSynchronizeStream` on it, so it is never waited for or destroyed again.
    abandoned: Mutex<Option<Error>>,
}

impl std::fmt::Debug for AclStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclStream").field("raw", &format_args!("{:#x}", self.raw)).field("owned", &self.owned).finish()
    }
}

/// How long an ACL error waits for the native side to name a failed rank behind it.
const ATTRIBUTION: Duration = Duration::from_millis(1500);
/// How long work may stay pending after a member left on purpose before the wait gives up
/// (HCCL would wait for it until HCCL_EXEC_TIMEOUT).
const DEPARTED_GRACE: Duration = Duration::from_millis(1000);

impl AclStream {
    /// `aclrtCreateStream`.
    pub fn create(backend: Arc<HcclLibrary>) -> Result<AclStream> {
        backend.bind()?;
        let f = need(backend.api.aclrtCreateStream, "aclrtCreateStream")?;
        let mut raw: RawStream = std::ptr::null_mut();
        // SAFETY: public signature; valid out pointer.
        backend.api.acl("aclrtCreateStream", unsafe { f(&mut raw) })?;
        if raw.is_null() {
            return Err(Error::new(ErrorKind::Backend, "aclrtCreateStream returned no stream"));
        }
        Ok(AclStream {
            backend,
            raw: raw as usize,
            owned: true,
            watched: Mutex::new(Vec::new()),
            abandoned: Mutex::new(None),
        })
    }

    /// Wraps the caller's stream (never destroyed by hccn).
    pub fn wrap(backend: Arc<HcclLibrary>, raw: RawStream) -> Result<AclStream> {
        if raw.is_null() {
            return Err(Error::null("acl_stream is NULL"));
        }
        Ok(AclStream {
            backend,
            raw: raw as usize,
            owned: false,
            watched: Mutex::new(Vec::new()),
            abandoned: Mutex::new(None),
        })
    }

    pub fn raw(&self) -> RawStream {
        self.raw as RawStream
    }

    pub(crate) fn watch(&self, s: &Arc<Shared>) {
        let mut w = self.watched.locked();
        w.retain(|x| x.strong_count() > 0);
        if !w.iter().any(|x| std::ptr::eq(x.as_ptr(), Arc::as_ptr(s))) {
            w.push(Arc::downgrade(s));
        }
    }

    fn watched(&self) -> Vec<Arc<Shared>> {
        self.watched.locked().iter().filter_map(|w| w.upgrade()).collect()
    }

    /// A member failure seen by the native side of a communicator with work here; that
    /// communicator's HCCL side is torn down.
    fn failure(&self) -> Option<Error> {
        for s in self.watched() {
            if let Err(e) = s.native.async_error() {
                if matches!(e.kind(), ErrorKind::RankFailed | ErrorKind::Revoked | ErrorKind::Aborted) {
                    s.teardown();
                    return Some(e);
                }
            }
        }
        None
    }

    /// A communicator with work here whose member left on purpose, with those ranks.
    fn departed(&self) -> Option<(Arc<Shared>, Vec<u32>)> {
        self.watched().into_iter().find_map(|s| {
            let gone = s.native.departed_ranks();
            (!gone.is_empty()).then_some((s, gone))
        })
    }

    /// Waits until everything queued on the stream is done; the stream's error, or the member
    /// failure behind it.
    pub fn wait(&self) -> Result<()> {
        self.backend.bind()?;
        self.usable()?;
        let api = &self.backend.api;
        let sync = need(api.aclrtSynchronizeStream, "aclrtSynchronizeStream")?;
        if let Some(query) = api.aclrtStreamQuery {
            let mut pause = Duration::from_micros(20);
            let mut left_since: Option<std::time::Instant> = None;
            loop {
                let mut status = -1;
                // SAFETY: public signature; valid out pointer.
                let rc = unsafe { query(self.raw(), &mut status) };
                if rc != 0 || status == ACL_STREAM_STATUS_COMPLETE {
                    break;
                }
                if let Some(e) = self.failure() {
                    return Err(self.abandon_unless_aborted(e));
                }
                if let Some((s, gone)) = self.departed() {
                    if left_since.get_or_insert_with(std::time::Instant::now).elapsed() >= DEPARTED_GRACE {
                        s.teardown();
                        return Err(self.abandon_unless_aborted(Error::new(
                            ErrorKind::Remote,
                            format!("rank(s) {gone:?} left the communicator while an operation still needed them"),
                        )));
                    }
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(2));
            }
        }
        let rc = if api.aclrtStreamQuery.is_some() {
            // SAFETY: public signature.
            unsafe { sync(self.raw()) }
        } else {
            self.sync_beside()?
        };
        match api.acl("aclrtSynchronizeStream", rc) {
            Ok(()) => {
                self.watched.locked().clear();
                Ok(())
            }
            Err(e) => {
                // A task failed; if a member died, say so (the native side may need a moment).
                let until = std::time::Instant::now() + ATTRIBUTION;
                loop {
                    if let Some(f) = self.failure() {
                        return Err(f);
                    }
                    if self.watched().is_empty() || std::time::Instant::now() >= until {
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// The error that made this stream unusable, if a wait abandoned it.
    pub(crate) fn usable(&self) -> Result<()> {
        match &*self.abandoned.locked() {
            Some(e) => {
                Err(e.clone().context("this ACL stream was abandoned after a failure (its tasks could not be stopped)"))
            }
            None => Ok(()),
        }
    }

    fn abandon(&self, why: &Error) {
        *self.abandoned.locked() = Some(why.clone());
    }

    /// A wait that gave up on pending tasks: without `aclrtDeviceTaskAbort` nothing stopped
    /// them, so the stream may never drain and is abandoned.
    fn abandon_unless_aborted(&self, why: Error) -> Error {
        if self.backend.api.aclrtDeviceTaskAbort.is_none() {
            self.abandon(&why);
        }
        why
    }

    /// Without `aclrtStreamQuery`: `aclrtSynchronizeStream` on a helper thread, while this
    /// thread watches the native side of the communicators with work here, as the polling loop
    /// does. On a failure the helper is left blocked (HCCL would hold the task until
    /// HCCL_EXEC_TIMEOUT unless `aclrtDeviceTaskAbort` stopped it) and the stream is abandoned.
    fn sync_beside(&self) -> Result<i32> {
        let (tx, rx) = mpsc::channel();
        let backend = self.backend.clone();
        let raw = self.raw;
        std::thread::Builder::new()
            .name("hccn-acl-sync".into())
            .spawn(move || {
                let rc = backend.bind().and_then(|()| {
                    let sync = need(backend.api.aclrtSynchronizeStream, "aclrtSynchronizeStream")?;
                    // SAFETY: public signature; the stream stays alive (an abandoned stream is
                    // never destroyed).
                    Ok(unsafe { sync(raw as RawStream) })
                });
                let _ = tx.send(rc);
            })
            .map_err(|e| Error::new(ErrorKind::System, format!("cannot start the ACL stream waiter thread: {e}")))?;
        let mut left_since: Option<std::time::Instant> = None;
        loop {
            match rx.recv_timeout(Duration::from_millis(2)) {
                Ok(rc) => return rc,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::internal("the ACL stream waiter thread ended without an answer"))
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            if let Some(e) = self.failure() {
                self.abandon(&e);
                return Err(e);
            }
            if let Some((s, gone)) = self.departed() {
                if left_since.get_or_insert_with(std::time::Instant::now).elapsed() >= DEPARTED_GRACE {
                    s.teardown();
                    let e = Error::new(
                        ErrorKind::Remote,
                        format!("rank(s) {gone:?} left the communicator while an operation still needed them"),
                    );
                    self.abandon(&e);
                    return Err(e);
                }
            }
        }
    }

    /// Waits without attributing errors (teardown paths).
    pub(crate) fn wait_quiet(&self) -> Result<()> {
        self.backend.bind()?;
        self.usable()?;
        let sync = need(self.backend.api.aclrtSynchronizeStream, "aclrtSynchronizeStream")?;
        // SAFETY: public signature.
        self.backend.api.acl("aclrtSynchronizeStream", unsafe { sync(self.raw()) })
    }

    /// `Ok(true)` when the stream is idle, `Ok(false)` while work is pending, or its error.
    pub fn query(&self) -> Result<bool> {
        match self.backend.api.aclrtStreamQuery {
            Some(q) => {
                let mut status = -1;
                // SAFETY: public signature; valid out pointer.
                let rc = unsafe { q(self.raw(), &mut status) };
                self.backend.api.acl("aclrtStreamQuery", rc)?;
                if status == ACL_STREAM_STATUS_COMPLETE {
                    self.wait().map(|()| true)
                } else {
                    match self.failure() {
                        Some(e) => Err(e),
                        None => Ok(false),
                    }
                }
            }
            // Without aclrtStreamQuery the only answer is to wait.
            None => self.wait().map(|()| true),
        }
    }
}

impl Drop for AclStream {
    fn drop(&mut self) {
        if !self.owned || self.usable().is_err() {
            return;
        }
        let _ = self.wait_quiet();
        if let Some(f) = self.backend.api.aclrtDestroyStream {
            // SAFETY: public signature; the stream was created by us and is destroyed once.
            unsafe { f(self.raw()) };
        }
    }
}
