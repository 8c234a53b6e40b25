//! The only place where C pointers become Rust values: the panic guard every exported body runs
//! in, handle tables for the opaque types, and checked reads and writes through pointers.

use hccn_runtime::sync::Locked;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use hccn_runtime::{fork, Error, Result};

use crate::error::{fail, set_last};
use crate::types::{hccn_result, HCCN_SUCCESS};

/// Runs an exported body: errors become codes with a last-error message, panics become
/// `HCCN_ERROR_INTERNAL`; nothing unwinds into C.
pub(crate) fn guard(f: impl FnOnce() -> Result<hccn_result>) -> hccn_result {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => fail(&e),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            set_last(&format!("internal error (a panic was caught at the C boundary): {what}"));
            crate::types::result_of(hccn_runtime::ErrorKind::Internal)
        }
    }
}

pub(crate) fn ok() -> Result<hccn_result> {
    Ok(HCCN_SUCCESS)
}

/// Live objects behind opaque pointers. A pointer is valid only while its object is in the
/// table, so a destroyed handle used again is an error, not a use-after-free.
pub(crate) struct Table<T> {
    kind: &'static str,
    map: Mutex<Option<Entries<T>>>,
}

/// Each object by its handle, with the fork generation it was made in (see
/// `hccn_runtime::fork`).
type Entries<T> = HashMap<usize, (u64, Arc<T>)>;

impl<T> Table<T> {
    pub const fn new(kind: &'static str) -> Self {
        Table { kind, map: Mutex::new(None) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Entries<T>) -> R) -> R {
        let mut g = self.map.locked();
        f(g.get_or_insert_with(HashMap::new))
    }

    /// Registers `value`; the returned address is its handle.
    pub fn insert<P>(&self, value: T) -> *mut P {
        let arc = Arc::new(value);
        // The handle keeps the object's provenance (no integer-to-pointer cast); C never
        // dereferences it and neither does the table, which compares addresses only.
        let handle = Arc::as_ptr(&arc).cast_mut().cast::<P>();
        self.with(|m| m.insert(handle as usize, (fork::generation(), arc)));
        handle
    }

    /// The live object behind `handle`; an error in a forked child for one its parent made.
    pub fn get<P>(&self, handle: *const P, arg: &str) -> Result<Arc<T>> {
        let (made_in, object) = self.entry(handle, arg, |m, h| m.get(&h).cloned())?;
        fork::check(made_in, self.kind).map_err(|e| e.context(arg))?;
        Ok(object)
    }

    /// Takes `handle` out of the table: the object, or `None` in a forked child for one its
    /// parent made, which is let go of without being dropped (its drop would close the parent's
    /// links and wait for threads that do not exist in the child).
    pub fn remove<P>(&self, handle: *const P, arg: &str) -> Result<Option<Arc<T>>> {
        let (made_in, object) = self.entry(handle, arg, |m, h| m.remove(&h))?;
        if fork::check(made_in, self.kind).is_err() {
            std::mem::forget(object);
            return Ok(None);
        }
        Ok(Some(object))
    }

    fn entry<P>(
        &self,
        handle: *const P,
        arg: &str,
        take: impl FnOnce(&mut Entries<T>, usize) -> Option<(u64, Arc<T>)>,
    ) -> Result<(u64, Arc<T>)> {
        if handle.is_null() {
            return Err(Error::null(format!("{arg} is NULL")));
        }
        self.with(|m| take(m, handle as usize))
            .ok_or_else(|| Error::invalid(format!("{arg} is not a live {} (destroyed, or never created)", self.kind)))
    }
}

/// Writes `value` through an output pointer that has already been checked for NULL.
pub(crate) fn write<T>(out: *mut T, value: T) {
    // SAFETY: callers check `out` with `out_ptr` first; the C caller promises it points to
    // writable memory for one T (docs/c-api.md: output parameters).
    unsafe { out.write(value) }
}

pub(crate) fn out_ptr<T>(out: *mut T, arg: &str) -> Result<*mut T> {
    if out.is_null() {
        return Err(Error::null(format!("{arg} (output) is NULL")));
    }
    Ok(out)
}

/// Copies `n` elements of a C array that must be non-NULL when `n > 0`.
pub(crate) fn array<T: Copy>(p: *const T, n: usize, arg: &str) -> Result<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(Error::null(format!("{arg} is NULL")));
    }
    // SAFETY: non-NULL, and the C caller promises `n` readable elements (docs/c-api.md).
    Ok(unsafe { std::slice::from_raw_parts(p, n) }.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Also run under Miri (scripts/test-hardening.sh): the handle table never dereferences a
    /// handle it did not hand out, and the pointer helpers touch only what they are given.
    #[test]
    fn handle_table_refuses_forged_null_and_destroyed_handles() {
        let t: Table<Vec<u32>> = Table::new("thing");
        let h: *mut u8 = t.insert(vec![1, 2, 3]);
        assert_eq!(t.get(h, "h").map(|v| v.len()).ok(), Some(3));
        let forged = h.wrapping_add(8).cast_const();
        assert!(t.get(forged, "forged").is_err());
        assert!(t.get(std::ptr::null::<u8>(), "null").is_err());
        let kept = t.get(h, "h").expect("live");
        assert!(t.remove(h, "h").is_ok());
        assert!(t.get(h, "h").is_err(), "a destroyed handle is refused");
        assert!(t.remove(h, "h").is_err(), "a double destroy is refused");
        // An Arc taken before the destroy stays valid for its holder.
        assert_eq!(kept[2], 3);
    }

    #[test]
    fn pointer_helpers() {
        let src = [5u64, 6, 7];
        assert_eq!(array(src.as_ptr(), 3, "a").ok(), Some(vec![5, 6, 7]));
        assert_eq!(array(std::ptr::null::<u64>(), 0, "a").ok(), Some(vec![]));
        assert!(array(std::ptr::null::<u64>(), 2, "a").is_err());
        let mut out = 0i32;
        let p = out_ptr(&mut out as *mut i32, "out").expect("non-null");
        write(p, 42);
        assert_eq!(out, 42);
        assert!(out_ptr(std::ptr::null_mut::<i32>(), "out").is_err());
        assert_eq!(guard(|| Err(Error::invalid("no"))), 1);
        assert_eq!(guard(|| panic!("boom")), 4, "a panic becomes HCCN_ERROR_INTERNAL");
    }
}
