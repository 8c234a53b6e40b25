//! Thread-local last error and the static result strings.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use hccn_runtime::Error;

use hccn_runtime::error::RESULT_CODES;

use crate::types::{hccn_result, result_of};

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Remembers `e` as this thread's last error and returns its code.
pub(crate) fn fail(e: &Error) -> hccn_result {
    set_last(e.message());
    result_of(e.kind())
}

pub(crate) fn set_last(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

pub(crate) fn last_ptr() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// A static, NUL-terminated description of `code`.
pub(crate) fn describe(code: hccn_result) -> &'static std::ffi::CStr {
    static STRINGS: std::sync::OnceLock<Vec<(u32, CString)>> = std::sync::OnceLock::new();
    let table = STRINGS.get_or_init(|| {
        RESULT_CODES.iter().map(|(_, _, v, text)| (*v, CString::new(*text).unwrap_or_default())).collect()
    });
    table.iter().find(|(v, _)| *v == code).map(|(_, s)| s.as_c_str()).unwrap_or(c"unknown hccn_result code")
}
