//! Builds hccl-emu's sources as the minimal test double: only the required symbols exported.
fn main() {
    println!("cargo::rustc-cfg=hccl_emu_minimal");
}
