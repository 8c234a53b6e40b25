//! Runs the collective matrix through the C ABI in one rank of a job started by hccnrun.
//! Usage: hccnrun -n N hccn-matrix [--quick]

use std::process::ExitCode;

use hccn_runtime::DataType;
use hccn_tests::{matrix, Coll};

fn main() -> ExitCode {
    let quick = std::env::args().any(|a| a == "--quick");
    let comm = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let dtypes: &[DataType] = if quick { &[DataType::Fp32, DataType::Int8, DataType::Bf16] } else { &DataType::ALL };
    let rep = matrix::run(&comm, dtypes, &matrix::COUNTS);
    for f in &rep.failures {
        println!("FAIL {f}");
    }
    println!("rank {} of {}: {} checks, {} failures", comm.rank(), comm.size(), rep.checks, rep.failures.len());
    if rep.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
