//! A task that talks to etcd for as long as something holds it (a lease, a run's presence): an
//! async function on a thread of its own with a single-threaded runtime, so that the ranks'
//! threads never block on etcd.

use std::future::Future;
use std::sync::mpsc;

use hccn_runtime::{Error, ErrorKind, Result};
use tokio::sync::oneshot;

/// The ends of a started task: its first answer (`ready`), the signal that stops it, and the
/// word that it has stopped.
pub(crate) struct Started<R> {
    pub ready: mpsc::Receiver<Result<R>>,
    pub stop: oneshot::Sender<()>,
    pub done: mpsc::Receiver<()>,
}

/// Starts `task(ready, stop)` on a thread named `name`; `what` names it in errors.
pub(crate) fn start<R, F, Fut>(name: &str, what: &str, task: F) -> Result<Started<R>>
where
    R: Send + 'static,
    F: FnOnce(mpsc::Sender<Result<R>>, oneshot::Receiver<()>) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (ready_tx, ready) = mpsc::channel::<Result<R>>();
    let (stop, stop_rx) = oneshot::channel();
    let (done_tx, done) = mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(Error::new(ErrorKind::System, format!("no runtime for etcd: {e}"))));
                    return;
                }
            };
            rt.block_on(task(ready_tx, stop_rx));
            let _ = done_tx.send(());
        })
        .map_err(|e| Error::new(ErrorKind::System, format!("no thread for {what}: {e}")))?;
    Ok(Started { ready, stop, done })
}
