//! Host streams and events. A stream runs its operations in order on its own worker thread; the
//! first error is sticky: later operations on the stream are not run and report it. An event
//! marks a point in a stream's queue; a callback runs on the worker at a point of the queue, with
//! the stream's status then (as `cudaStreamAddCallback`), so that a caller can complete its own
//! futures without a thread of its own waiting.

use crate::error::{Error, ErrorKind, Result};
use sync::{mpsc, thread, Arc, Condvar, Locked, Mutex, MutexGuard, Waits};

/// The synchronisation this module uses: std's, or loom's under `--cfg loom` so that
/// `cargo test --lib stream` with `RUSTFLAGS="--cfg loom"` model-checks every interleaving.
#[cfg(not(loom))]
mod sync {
    pub(crate) use crate::sync::{Locked, Waits};
    pub(crate) use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
    pub(crate) use std::thread;
}

#[cfg(loom)]
mod sync {
    pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
    pub(crate) use loom::thread;

    /// crate::sync's helpers for loom's types: the same poison policy.
    pub(crate) trait Locked<T> {
        fn locked(&self) -> MutexGuard<'_, T>;
    }
    impl<T> Locked<T> for Mutex<T> {
        fn locked(&self) -> MutexGuard<'_, T> {
            self.lock().unwrap_or_else(|p| p.into_inner())
        }
    }
    pub(crate) trait Waits {
        fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;
    }
    impl Waits for Condvar {
        fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.wait(guard).unwrap_or_else(|p| p.into_inner())
        }
    }

    /// std's channel (a hang-up ends `recv`) from loom's primitives; loom's own mpsc cannot
    /// report a hang-up, which is how a stream's worker learns to exit.
    pub(crate) mod mpsc {
        use super::{Arc, Condvar, Locked, Mutex, Waits};
        use std::collections::VecDeque;

        struct Chan<T> {
            state: Mutex<(VecDeque<T>, usize)>,
            ready: Condvar,
        }

        pub(crate) struct Sender<T>(Arc<Chan<T>>);
        pub(crate) struct Receiver<T>(Arc<Chan<T>>);

        pub(crate) fn channel<T>() -> (Sender<T>, Receiver<T>) {
            let c = Arc::new(Chan { state: Mutex::new((VecDeque::new(), 1)), ready: Condvar::new() });
            (Sender(c.clone()), Receiver(c))
        }

        impl<T> Sender<T> {
            pub(crate) fn send(&self, v: T) -> Result<(), T> {
                self.0.state.locked().0.push_back(v);
                self.0.ready.notify_one();
                Ok(())
            }
        }

        impl<T> Drop for Sender<T> {
            fn drop(&mut self) {
                self.0.state.locked().1 -= 1;
                self.0.ready.notify_one();
            }
        }

        impl<T> Receiver<T> {
            pub(crate) fn recv(&self) -> Result<T, ()> {
                let mut g = self.0.state.locked();
                loop {
                    if let Some(v) = g.0.pop_front() {
                        return Ok(v);
                    }
                    if g.1 == 0 {
                        return Err(());
                    }
                    g = self.0.ready.wait_locked(g);
                }
            }
        }
    }
}

pub type Job = Box<dyn FnOnce() -> Result<()> + Send>;

/// Runs once everything queued before it has finished, with the stream's status at that point
/// (the first error, if any). Never skipped, not even after an error.
pub type Callback = Box<dyn FnOnce(Result<()>) + Send>;

enum Item {
    Job(Job),
    Callback(Callback),
}

#[derive(Default)]
struct Progress {
    enqueued: u64,
    completed: u64,
    error: Option<Error>,
}

struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
}

impl Shared {
    fn new() -> Self {
        Shared { progress: Mutex::new(Progress::default()), changed: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.locked()
    }

    fn wait_for(&self, ticket: u64) -> Result<()> {
        let mut p = self.lock();
        while p.completed < ticket {
            p = self.changed.wait_locked(p);
        }
        p.error.clone().map_or(Ok(()), Err)
    }
}

/// An ordered queue of operations with its own worker thread.
pub struct Stream {
    shared: Arc<Shared>,
    tx: Mutex<Option<mpsc::Sender<Item>>>,
    worker: Mutex<Option<thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.shared.lock();
        f.debug_struct("Stream").field("enqueued", &p.enqueued).field("completed", &p.completed).finish()
    }
}

impl Stream {
    pub fn new() -> Result<Stream> {
        let shared = Arc::new(Shared::new());
        let (tx, rx) = mpsc::channel::<Item>();
        let s2 = shared.clone();
        let worker = thread::Builder::new()
            .name("hccn-stream".into())
            .spawn(move || {
                while let Ok(item) = rx.recv() {
                    let failed_before = s2.lock().error.clone();
                    // A panic must not kill the worker: synchronize would wait forever.
                    let result = match item {
                        Item::Job(_) if failed_before.is_some() => Ok(()),
                        Item::Job(job) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                            .unwrap_or_else(|_| Err(Error::internal("an operation on this stream panicked"))),
                        Item::Callback(cb) => {
                            let status = failed_before.map_or(Ok(()), Err);
                            // A callback's panic is its own: it does not fail the stream.
                            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || cb(status)));
                            Ok(())
                        }
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
        self.send(&mut p, Item::Job(job))
    }

    /// Queues `cb`, which the worker calls once everything queued before it has finished, with
    /// the stream's status then. Queued after an error too (it then gets the error); fails only
    /// while the stream is being destroyed. `cb` must not wait for this stream.
    pub fn enqueue_callback(&self, cb: Callback) -> Result<()> {
        let mut p = self.shared.lock();
        self.send(&mut p, Item::Callback(cb))
    }

    fn send(&self, p: &mut MutexGuard<'_, Progress>, item: Item) -> Result<()> {
        let tx = self.tx.locked();
        let tx = tx.as_ref().ok_or_else(|| Error::invalid("the stream is being destroyed"))?;
        tx.send(item).map_err(|_| Error::internal("stream worker is gone"))?;
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
        self.tx.locked().take();
        if let Some(w) = self.worker.locked().take() {
            let _ = w.join();
        }
    }
}

/// A completion marker: recorded at the current end of a stream's queue.
pub struct Event {
    mark: Mutex<Option<(Arc<Shared>, u64)>>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("recorded", &self.mark.lock().map(|m| m.is_some()).unwrap_or(false)).finish()
    }
}

impl Default for Event {
    fn default() -> Self {
        Event { mark: Mutex::new(None) }
    }
}

impl Event {
    pub fn new() -> Event {
        Event::default()
    }

    /// Marks everything queued on `stream` so far; `None` (the blocking stream) is complete at once.
    pub fn record(&self, stream: Option<&Stream>) {
        let mark = stream.map(|s| (s.shared.clone(), s.shared.lock().enqueued));
        *self.mark.locked() = mark;
    }

    fn mark(&self) -> Option<(Arc<Shared>, u64)> {
        self.mark.locked().clone()
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

#[cfg(all(test, not(loom)))]
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

    #[test]
    fn callbacks_run_in_order_with_the_status_even_after_an_error() {
        let s = Stream::new().expect("stream");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = |tag: &'static str| {
            let seen = seen.clone();
            Box::new(move |status: Result<()>| {
                seen.lock().expect("lock").push((tag, status.err().map(|e| e.kind())));
            })
        };
        let s2 = seen.clone();
        s.enqueue(Box::new(move || {
            std::thread::sleep(Duration::from_millis(5));
            s2.lock().expect("lock").push(("job", None));
            Ok(())
        }))
        .expect("enqueue");
        s.enqueue_callback(log("first")).expect("callback");
        s.enqueue(Box::new(|| Err(Error::timeout("boom")))).expect("enqueue");
        s.enqueue_callback(log("after the error")).expect("callback");
        assert!(s.synchronize().is_err());
        // Queued on a failed stream: still run, with the error.
        s.enqueue_callback(log("late")).expect("a callback is queued on a failed stream");
        let _ = s.synchronize();
        let panicking: Callback = Box::new(|_| panic!("a callback's own panic"));
        s.enqueue_callback(panicking).expect("callback");
        s.enqueue_callback(log("after a panic")).expect("callback");
        drop(s); // waits for the queue
        let got = seen.lock().expect("lock").clone();
        let timeout = Some(ErrorKind::Timeout);
        assert_eq!(
            got,
            vec![
                ("job", None),
                ("first", None),
                ("after the error", timeout),
                ("late", timeout),
                ("after a panic", timeout)
            ]
        );
    }
}

/// Model checks of the stream/event protocol (every interleaving loom finds, within its bounds):
/// `RUSTFLAGS="--cfg loom" cargo test -p hccn-runtime --lib --release stream::loom_tests`
/// (scripts/test-hardening.sh).
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::{AtomicUsize, Ordering};

    fn counting(n: &Arc<AtomicUsize>) -> Job {
        let n = n.clone();
        Box::new(move || {
            n.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }

    #[test]
    fn synchronize_returns_after_all_queued_work() {
        loom::model(|| {
            let s = Stream::new().expect("stream");
            let ran = Arc::new(AtomicUsize::new(0));
            s.enqueue(counting(&ran)).expect("enqueue");
            s.enqueue(counting(&ran)).expect("enqueue");
            assert!(s.synchronize().is_ok());
            assert_eq!(ran.load(Ordering::SeqCst), 2);
            assert_eq!(s.query().ok(), Some(true));
        });
    }

    #[test]
    fn an_event_waited_on_another_thread_sees_its_work_done() {
        loom::model(|| {
            let s = Stream::new().expect("stream");
            let ran = Arc::new(AtomicUsize::new(0));
            s.enqueue(counting(&ran)).expect("enqueue");
            let ev = Arc::new(Event::new());
            ev.record(Some(&s));
            let (ev2, ran2) = (ev.clone(), ran.clone());
            let waiter = thread::spawn(move || {
                // Whatever the interleaving: a query never reports done before the work ran.
                if ev2.query().ok() == Some(true) {
                    assert!(ran2.load(Ordering::SeqCst) >= 1);
                }
                assert!(ev2.synchronize().is_ok());
                // The marked job ran; the one queued after the record may have too.
                assert!(ran2.load(Ordering::SeqCst) >= 1);
            });
            // Work queued after the record is not part of the event.
            s.enqueue(counting(&ran)).expect("enqueue");
            waiter.join().expect("waiter");
            drop(s);
            assert_eq!(ran.load(Ordering::SeqCst), 2, "dropping a stream finishes its queue");
        });
    }

    #[test]
    fn the_first_error_sticks_and_reaches_events() {
        loom::model(|| {
            let s = Stream::new().expect("stream");
            let ran = Arc::new(AtomicUsize::new(0));
            s.enqueue(Box::new(|| Err(Error::timeout("first")))).expect("enqueue");
            let ev = Event::new();
            ev.record(Some(&s));
            // Queued before or after the worker fails: it never runs.
            let _ = s.enqueue(counting(&ran));
            assert_eq!(ev.synchronize().err().map(|e| e.kind()), Some(ErrorKind::Timeout));
            assert_eq!(s.synchronize().err().map(|e| e.kind()), Some(ErrorKind::Timeout));
            assert!(s.enqueue(counting(&ran)).is_err());
            drop(s);
            assert_eq!(ran.load(Ordering::SeqCst), 0);
        });
    }

    #[test]
    fn a_callback_runs_once_after_the_work_before_it_with_its_status() {
        loom::model(|| {
            let s = Stream::new().expect("stream");
            let ran = Arc::new(AtomicUsize::new(0));
            let calls = Arc::new(AtomicUsize::new(0));
            s.enqueue(counting(&ran)).expect("enqueue");
            let (ran2, calls2) = (ran.clone(), calls.clone());
            s.enqueue_callback(Box::new(move |status| {
                assert!(status.is_ok());
                assert_eq!(ran2.load(Ordering::SeqCst), 1, "the work before it has run");
                calls2.fetch_add(1, Ordering::SeqCst);
            }))
            .expect("callback");
            s.enqueue(Box::new(|| Err(Error::timeout("failed")))).expect("enqueue");
            let calls3 = calls.clone();
            // Queued before or after the failure has run: it is called, with the error.
            s.enqueue_callback(Box::new(move |status| {
                assert_eq!(status.err().map(|e| e.kind()), Some(ErrorKind::Timeout));
                calls3.fetch_add(1, Ordering::SeqCst);
            }))
            .expect("a callback is queued on a failed stream");
            drop(s);
            assert_eq!(calls.load(Ordering::SeqCst), 2, "each callback exactly once");
        });
    }
}
