//! The C types of docs/c-api.md. Enum parameters are raw integers on the Rust side, so that an unknown
//! value from C is an error and never undefined behaviour; the header declares them as the C
//! enums of the contract (see [`header_enums`]).

#![allow(non_camel_case_types)]

use hccn_runtime::error::RESULT_CODES;
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

pub const HCCN_SUCCESS: hccn_result = 0;
pub const HCCN_IN_PROGRESS: hccn_result = 103;

/// The result code for a runtime error kind (the runtime's one table, `RESULT_CODES`).
pub fn result_of(kind: ErrorKind) -> hccn_result {
    kind.code()
}

fn c_enum(name: &str, doc: &str, items: &[(String, u32)]) -> String {
    let body: Vec<String> = items.iter().map(|(n, v)| format!("  {n} = {v},")).collect();
    format!("/* {doc} */\ntypedef enum {name} {{\n{}\n}} {name};\n", body.join("\n"))
}

/// The C enum definitions of the header, made from the same tables the code uses.
pub fn header_enums() -> String {
    let results: Vec<(String, u32)> = RESULT_CODES.iter().map(|(_, n, v, _)| (n.to_string(), *v)).collect();
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
