//! One policy for poisoned locks. hccn's locks guard state that stays consistent at every
//! unlock (no invariant is broken half-way through a critical section), so a panic on another
//! thread — often the caller's own code in a callback — must not turn every later call into a
//! second panic across the C ABI. Every lock in hccn is taken through these helpers.

use std::sync::{Condvar, LockResult, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

fn recover<G>(r: LockResult<G>) -> G {
    r.unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// [`Mutex::lock`], ignoring poison.
pub trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        recover(self.lock())
    }
}

/// [`RwLock::read`] and [`RwLock::write`], ignoring poison.
pub trait RwLocked<T: ?Sized> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLocked<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        recover(self.read())
    }
    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        recover(self.write())
    }
}

/// [`Condvar::wait`] and [`Condvar::wait_timeout`], ignoring poison; callers re-check their
/// condition and deadline after every wake, so the timeout flag is not returned.
pub trait Waits {
    fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;
    fn wait_locked_for<'a, T>(&self, guard: MutexGuard<'a, T>, limit: Duration) -> MutexGuard<'a, T>;
}

impl Waits for Condvar {
    fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        recover(self.wait(guard))
    }
    fn wait_locked_for<'a, T>(&self, guard: MutexGuard<'a, T>, limit: Duration) -> MutexGuard<'a, T> {
        recover(self.wait_timeout(guard, limit)).0
    }
}
