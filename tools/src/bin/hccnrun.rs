//! Launches N local ranks of a program as one hccn job; see `hccnrun --help`.

fn main() {
    std::process::exit(hccn_tools::launch::main());
}
