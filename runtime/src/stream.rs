//! Host streams and events. A stream runs its operations in order on its own worker thread; the
//! first error is sticky: later operations on the stream are not run and report it. An event
//! marks a point in a stream's queue.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::error::{Error, ErrorKind, Result};

pub type Job = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct Progress {
    enqueued: u64,
    completed: u64,
    error: Option<Error>,
}

#[derive(Default)]
struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait_for(&self, ticket: u64) -> Result<()> {
        let mut p = self.lock();
        while p.completed < ticket {
            p = self.changed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        p.error.clone().map_or(Ok(()), Err)
    }
}

/// An ordered queue of operations with its own worker thread.
pub struct Stream {
    shared: Arc<Shared>,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.shared.lock();
        f.debug_struct("Stream").field("enqueued", &p.enqueued).field("completed", &p.completed).finish()
    }
}

impl Stream {
    pub fn new() -> Result<Stream> {
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel::<Job>();
        let s2 = shared.clone();
        let worker = std::thread::Builder::new()
            .name("hccn-stream".into())
            .spawn(move || {
                for job in rx {
                    let failed_before = s2.lock().error.is_some();
                    let result = if failed_before {
                        Ok(())
                    } else {
                        // A panic must not kill the worker: synchronize would wait forever.
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                            .unwrap_or_else(|_| Err(Error::internal("an operation on this stream panicked")))
                    };
                    let mut p = s2.lock();
                    if let Err(e) = result {
                        p.error.get_or_insert(e);
                    }
                    p.completed += 1;
                    drop(p);
                    s2.changed.notify_all();
                }
            })
            .map_err(|e| Error::new(ErrorKind::System, format!("cannot start a stream thread: {e}")))?;
        Ok(Stream { shared, tx: Mutex::new(Some(tx)), worker: Mutex::new(Some(worker)) })
    }

    /// Queues `job`; fails at once with the stream's sticky error, if any.
    pub fn enqueue(&self, job: Job) -> Result<()> {
        let mut p = self.shared.lock();
        if let Some(e) = &p.error {
            return Err(e.clone());
        }
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let tx = tx.as_ref().ok_or_else(|| Error::invalid("the stream is being destroyed"))?;
        tx.send(job).map_err(|_| Error::internal("stream worker is gone"))?;
        p.enqueued += 1;
        Ok(())
    }

    /// Waits for everything queued so far; returns the first error of the stream, if any.
    pub fn synchronize(&self) -> Result<()> {
        let ticket = self.shared.lock().enqueued;
        self.shared.wait_for(ticket)
    }

    /// `Ok(true)` when all queued work is done, `Ok(false)` while some is pending, or the error.
    pub fn query(&self) -> Result<bool> {
        let p = self.shared.lock();
        match &p.error {
            Some(e) => Err(e.clone()),
            None => Ok(p.completed == p.enqueued),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Closing the channel lets the worker finish the queue and exit.
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = w.join();
        }
    }
}

/// A completion marker: recorded at the current end of a stream's queue.
#[derive(Default)]
pub struct Event {
    mark: Mutex<Option<(Arc<Shared>, u64)>>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("recorded", &self.mark.lock().map(|m| m.is_some()).unwrap_or(false)).finish()
    }
}

impl Event {
    pub fn new() -> Event {
        Event::default()
    }

    /// Marks everything queued on `stream` so far; `None` (the blocking stream) is complete at once.
    pub fn record(&self, stream: Option<&Stream>) {
        let mark = stream.map(|s| (s.shared.clone(), s.shared.lock().enqueued));
        *self.mark.lock().unwrap_or_else(|e| e.into_inner()) = mark;
    }

    fn mark(&self) -> Option<(Arc<Shared>, u64)> {
        self.mark.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `Ok(true)` once the marked work is done (or nothing was recorded), else `Ok(false)`;
    /// the stream's error if the marked work failed.
    pub fn query(&self) -> Result<bool> {
        let Some((shared, ticket)) = self.mark() else { return Ok(true) };
        let p = shared.lock();
        if p.completed < ticket {
            return Ok(false);
        }
        p.error.clone().map_or(Ok(true), Err)
    }

    pub fn synchronize(&self) -> Result<()> {
        match self.mark() {
            Some((shared, ticket)) => shared.wait_for(ticket),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[test]
    fn runs_in_order_and_errors_stick() {
        let s = Stream::new().expect("stream");
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 0..5 {
            let seen = seen.clone();
            s.enqueue(Box::new(move || {
                std::thread::sleep(Duration::from_millis(2));
                seen.lock().expect("lock").push(i);
                Ok(())
            }))
            .expect("enqueue");
        }
        let ev = Event::new();
        ev.record(Some(&s));
        assert!(ev.synchronize().is_ok());
        assert_eq!(*seen.lock().expect("lock"), vec![0, 1, 2, 3, 4]);
        let ran = Arc::new(AtomicU32::new(0));
        s.enqueue(Box::new(|| Err(Error::timeout("boom")))).expect("enqueue");
        let r2 = ran.clone();
        // Refused at once when the failing job has already run; never run either way.
        let _ = s.enqueue(Box::new(move || {
            r2.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }));
        assert_eq!(s.synchronize().err().map(|e| e.kind()), Some(ErrorKind::Timeout));
        assert_eq!(ran.load(Ordering::SeqCst), 0, "work after an error is not run");
        assert!(s.query().is_err());
        assert!(s.enqueue(Box::new(|| Ok(()))).is_err());
    }
}
