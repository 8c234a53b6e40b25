//! Goodbyes at process exit. A process that ended without destroying its communicators (a
//! Python script that never calls `hccn.finalize()`, torch's default group at interpreter exit,
//! a C program that returns from `main`) closed its connections without a word, and every peer
//! still running warned "peer failed" about a clean exit. An `atexit` hook, installed with the
//! first world, ends every world still alive in this process as its drop would, but with a
//! goodbye that says the process exits ([`EXIT_TAG`]): the peers count the rank failed, as
//! before (it never destroyed its communicator, so operations that need it fail with
//! HCCN_ERROR_RANK_FAILED), but log it as news, not as a warning. A process that crashes or is
//! killed runs no hook, and its peers warn as ever. Worlds inherited across a fork are the
//! parent's: a child's exit leaves them alone (fork.rs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};

use super::net::Net;
use crate::sync::Locked;

/// The tag of a goodbye sent at process exit (a destroy's goodbye has 0).
pub(crate) const EXIT_TAG: u32 = 1;

/// Set once the exit hook runs: goodbyes from then on say the process exits.
static EXITING: AtomicBool = AtomicBool::new(false);

/// The tag of the goodbyes this process sends now.
pub(crate) fn goodbye_tag() -> u32 {
    match EXITING.load(Ordering::SeqCst) {
        true => EXIT_TAG,
        false => 0,
    }
}

/// The worlds made in this process, with the fork generation each was made in.
static WORLDS: Mutex<Vec<(u64, Weak<Net>)>> = Mutex::new(Vec::new());

/// Says goodbye for `net` at process exit unless it ends before.
pub(super) fn register(net: &Arc<Net>) {
    static HOOK: Once = Once::new();
    // SAFETY: registers a function taking no arguments, once per process; libc runs it at
    // exit() (or when libhccn is unloaded), in the exiting thread.
    HOOK.call_once(|| unsafe {
        libc::atexit(at_exit);
    });
    let mut worlds = WORLDS.locked();
    worlds.retain(|(_, w)| w.strong_count() > 0);
    worlds.push((crate::fork::generation(), Arc::downgrade(net)));
}

extern "C" fn at_exit() {
    EXITING.store(true, Ordering::SeqCst);
    let generation = crate::fork::generation();
    let alive: Vec<Arc<Net>> = std::mem::take(&mut *WORLDS.locked())
        .into_iter()
        .filter(|(g, _)| *g == generation)
        .filter_map(|(_, w)| w.upgrade())
        .collect();
    for net in &alive {
        net.end();
    }
}
