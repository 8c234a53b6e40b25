//! Merges per-rank trace files into a heat map, a timeline and a summary; see `hccn-trace --help`.

fn main() {
    std::process::exit(hccn_tools::trace::main());
}
