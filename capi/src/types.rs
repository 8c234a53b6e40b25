//! The C types of API.md. Enum parameters are raw integers on the Rust side, so that an unknown
//! value from C is an error and never undefined behaviour; the header declares them as the C
//! enums of the contract (see [`header_enums`]).

#![allow(non_camel_case_types)]

use hccn_runtime::{DataType, ErrorKind, ReduceOp};

/// `hccn_result` (a C enum in the header).
pub type hccn_result = u32;
/// `hccn_datatype` (a C enum in the header).
pub type hccn_datatype = u32;
/// `hccn_reduce_op` (a C enum in the header).
pub type hccn_reduce_op = u32;

/// Opaque communicator.
#[derive(Debug)]
pub struct hccn_comm {
    _private: [u8; 0],
}

/// Opaque ordered host queue.
#[derive(Debug)]
pub struct hccn_stream {
    _private: [u8; 0],
}

/// Opaque completion marker.
#[derive(Debug)]
pub struct hccn_event {
    _private: [u8; 0],
}

/// Opaque fusion bucket: tensors added to it are allreduced together.
#[derive(Debug)]
pub struct hccn_bucket {
    _private: [u8; 0],
}

/// Called on a stream's thread by `hccn_stream_add_callback`: the stream's status, the caller's data.
pub type hccn_stream_callback = Option<unsafe extern "C" fn(status: hccn_result, user_data: *mut std::ffi::c_void)>;

/// What a rank needs to join a communicator: share these bytes out of band.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hccn_unique_id {
    pub internal: [u8; 128],
}

/// Every result code: name, number (HcclResult's where the meaning is the same), meaning.
pub const RESULTS: &[(&str, u32, &str)] = &[
    ("HCCN_SUCCESS", 0, "success"),
    ("HCCN_ERROR_INVALID_ARGUMENT", 1, "invalid argument"),
    ("HCCN_ERROR_NULL_POINTER", 2, "null pointer"),
    ("HCCN_ERROR_OUT_OF_MEMORY", 3, "out of memory"),
    ("HCCN_ERROR_INTERNAL", 4, "internal error"),
    ("HCCN_ERROR_NOT_SUPPORTED", 5, "not supported"),
    ("HCCN_ERROR_NOT_FOUND", 6, "not found"),
    ("HCCN_ERROR_UNAVAILABLE", 7, "unavailable"),
    ("HCCN_ERROR_SYSTEM", 8, "system call failed"),
    ("HCCN_ERROR_TIMEOUT", 9, "timed out"),
    ("HCCN_ERROR_CONNECT", 11, "connection failed"),
    ("HCCN_ERROR_TRANSFER", 13, "transfer failed"),
    ("HCCN_ERROR_BACKEND", 15, "backend library failed"),
    ("HCCN_ERROR_REMOTE", 21, "remote peer error"),
    ("HCCN_ERROR_RANK_FAILED", 100, "a member rank failed or is unreachable"),
    ("HCCN_ERROR_REVOKED", 101, "communicator revoked"),
    ("HCCN_ERROR_ABORTED", 102, "communicator aborted"),
    ("HCCN_IN_PROGRESS", 103, "in progress"),
    ("HCCN_ERROR_AUTH", 104, "job-token authentication failed"),
    ("HCCN_ERROR_STORE", 105, "rendezvous store unreachable or refused"),
    ("HCCN_ERROR_STALE_EPOCH", 106, "stale epoch"),
];

pub const HCCN_SUCCESS: hccn_result = 0;
pub const HCCN_IN_PROGRESS: hccn_result = 103;

/// The result code for a runtime error kind.
pub fn result_of(kind: ErrorKind) -> hccn_result {
    match kind {
        ErrorKind::InvalidArgument => 1,
        ErrorKind::NullPointer => 2,
        ErrorKind::OutOfMemory => 3,
        ErrorKind::Internal => 4,
        ErrorKind::NotSupported => 5,
        ErrorKind::NotFound => 6,
        ErrorKind::Unavailable => 7,
        ErrorKind::System => 8,
        ErrorKind::Timeout => 9,
        ErrorKind::Connect => 11,
        ErrorKind::Transfer => 13,
        ErrorKind::Backend => 15,
        ErrorKind::Remote => 21,
        ErrorKind::RankFailed => 100,
        ErrorKind::Revoked => 101,
        ErrorKind::Aborted => 102,
        ErrorKind::Auth => 104,
        ErrorKind::Store => 105,
        ErrorKind::StaleEpoch => 106,
    }
}

fn c_enum(name: &str, doc: &str, items: &[(String, u32)]) -> String {
    let body: Vec<String> = items.iter().map(|(n, v)| format!("  {n} = {v},")).collect();
    format!("/* {doc} */\ntypedef enum {name} {{\n{}\n}} {name};\n", body.join("\n"))
}

/// The C enum definitions of the header, made from the same tables the code uses.
pub fn header_enums() -> String {
    let results: Vec<(String, u32)> = RESULTS.iter().map(|(n, v, _)| (n.to_string(), *v)).collect();
    let dtypes: Vec<(String, u32)> =
        DataType::ALL.iter().map(|d| (format!("HCCN_{}", d.name().to_uppercase()), *d as u32)).collect();
    let ops: Vec<(String, u32)> =
        ReduceOp::ALL.iter().map(|o| (format!("HCCN_{}", o.name().to_uppercase()), *o as u32)).collect();
    [
        c_enum(
            "hccn_result",
            "Same numbers as HcclResult where the meaning is the same; hccn's own from 100.",
            &results,
        ),
        c_enum("hccn_datatype", "Same numbers as HcclDataType.", &dtypes),
        c_enum("hccn_reduce_op", "Same numbers as HcclReduceOp; AVG is hccn's own.", &ops),
    ]
    .join("\n")
}
