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
use std::sync::{Arc, Mutex, Weak};

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

/// Keeps `net` among the worlds of this process. The exit hook that said goodbye for them is
/// not installed: ending the worlds at exit made a rank that exits with an error code leave
/// after the peers that reacted to its goodbye, so a launcher reporting the first exit by time
/// (hccnrun) reported a survivor's code instead of the failing rank's (issue 45).
pub(super) fn register(net: &Arc<Net>) {
    let mut worlds = WORLDS.locked();
    worlds.retain(|(_, w)| w.strong_count() > 0);
    worlds.push((crate::fork::generation(), Arc::downgrade(net)));
}
