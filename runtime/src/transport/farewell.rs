//! Goodbyes at process exit. A process that ends without destroying its communicators (a
//! Python script that never calls `hccn.finalize()`, torch's default group at interpreter exit,
//! a C program that returns from `main`) closes its connections without a word, and every peer
//! still running would warn "peer failed" about a clean exit. An exit hook, installed with the
//! first world, ends every world still alive in this process as its drop would, but with a
//! goodbye that says the process exits ([`EXIT_TAG`]): the peers count the rank failed, as
//! before (it never destroyed its communicator, so operations that need it fail with
//! HCCN_ERROR_RANK_FAILED), but log it as news, not as a warning.
//!
//! Only an exit with status 0 says goodbye. A process that exits with an error code is a
//! failure its peers warn of, and it must leave before they react: a launcher that reports the
//! first exit (hccnrun, mpirun) must see its code, not a survivor's (issue 45). A process that
//! crashes or is killed runs no hook either. Worlds inherited across a fork are the parent's: a
//! child's exit leaves them alone (fork.rs).

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

/// Says goodbye for `net` at a successful process exit unless it ends before.
pub(super) fn register(net: &Arc<Net>) {
    static HOOK: Once = Once::new();
    HOOK.call_once(install);
    let mut worlds = WORLDS.locked();
    worlds.retain(|(_, w)| w.strong_count() > 0);
    worlds.push((crate::fork::generation(), Arc::downgrade(net)));
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" {
    /// glibc's `on_exit`: like `atexit`, but the function is given the exit status.
    fn on_exit(f: extern "C" fn(libc::c_int, *mut libc::c_void), arg: *mut libc::c_void) -> libc::c_int;
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn install() {
    // The hook is not tied to this library as `atexit`'s are (glibc runs those at dlclose):
    // the library stays loaded from now on, so that the hook is there at exit.
    // SAFETY: dladdr reads the loader's tables for an address in this library; dlopen with
    // RTLD_NOLOAD only takes one more reference to a library already loaded (or fails, which
    // leaves everything as it was, in a program that links hccn statically).
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(install as *const libc::c_void, &mut info) != 0 && !info.dli_fname.is_null() {
            libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE);
        }
        // SAFETY: registers a function once per process; libc runs it in the exiting thread.
        on_exit(at_exit, std::ptr::null_mut());
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn install() {}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn at_exit(status: libc::c_int, _: *mut libc::c_void) {
    if status != 0 {
        return;
    }
    EXITING.store(true, Ordering::SeqCst);
    let generation = crate::fork::generation();
    // A thread that exits while another holds the list (registering a world) gives up the
    // goodbyes rather than wait for it.
    let Ok(mut worlds) = WORLDS.try_lock() else { return };
    let alive: Vec<Arc<Net>> = std::mem::take(&mut *worlds)
        .into_iter()
        .filter(|(g, _)| *g == generation)
        .filter_map(|(_, w)| w.upgrade())
        .collect();
    drop(worlds);
    for net in &alive {
        net.end();
    }
}
