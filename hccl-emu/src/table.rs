//! Handles of the double: opaque pointers that are keys of live objects, so a stale or foreign
//! handle is an error rather than undefined behaviour.

use hccn_runtime::sync::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub struct Table<T> {
    map: Mutex<Option<HashMap<usize, Arc<T>>>>,
}

impl<T> Table<T> {
    pub const fn new() -> Self {
        Table { map: Mutex::new(None) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<usize, Arc<T>>) -> R) -> R {
        let mut g = self.map.locked();
        f(g.get_or_insert_with(HashMap::new))
    }

    pub fn insert(&self, v: T) -> *mut std::ffi::c_void {
        let a = Arc::new(v);
        let key = Arc::as_ptr(&a) as usize;
        self.with(|m| m.insert(key, a));
        key as *mut std::ffi::c_void
    }

    pub fn get(&self, h: *const std::ffi::c_void) -> Option<Arc<T>> {
        self.with(|m| m.get(&(h as usize)).cloned())
    }

    pub fn remove(&self, h: *const std::ffi::c_void) -> Option<Arc<T>> {
        self.with(|m| m.remove(&(h as usize)))
    }

    pub fn all(&self) -> Vec<Arc<T>> {
        self.with(|m| m.values().cloned().collect())
    }
}
