//! Times hccn collectives over a range of sizes, like nccl-tests; see `hccn-perf --help`.

fn main() {
    std::process::exit(hccn_tools::perf::main());
}
