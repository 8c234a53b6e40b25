//! Prints the job's hosts, links (measured) and algorithm choices; run under hccnrun.

fn main() {
    std::process::exit(hccn_tools::info::main());
}
