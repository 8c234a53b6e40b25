//! The shape of the code, checked from the sources (docs/architecture.md): layers that point
//! down, one backend seam, small files.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn files_under(dir: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    rust_files(&root().join(dir), &mut v);
    assert!(!v.is_empty(), "no Rust files under {dir}");
    v
}

fn text(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn the_transport_imports_nothing_from_the_layers_above_it() {
    for f in files_under("runtime/src/transport") {
        let t = text(&f);
        for above in ["crate::collectives", "crate::comm", "crate::backend", "crate::fusion"] {
            assert!(
                !t.contains(above),
                "{} uses {above}: the transport must not know the layers above it",
                f.display()
            );
        }
    }
}

#[test]
fn the_collectives_do_not_reach_up_into_the_communicator() {
    for f in files_under("runtime/src/collectives") {
        let t = text(&f);
        for above in ["crate::comm", "crate::backend"] {
            assert!(!t.contains(above), "{} uses {above}", f.display());
        }
    }
}

#[test]
fn no_library_file_is_over_800_lines() {
    for dir in ["runtime/src", "capi/src", "tools/src", "backend-hccl/src", "recovery/src", "hccl-emu/src"] {
        for f in files_under(dir) {
            let lines = text(&f).lines().count();
            assert!(lines <= 800, "{} has {lines} lines: two ideas share a room", f.display());
        }
    }
}

#[test]
fn the_c_abi_has_no_backend_dispatch_of_its_own() {
    for f in files_under("capi/src") {
        let t = text(&f);
        for line in t.lines() {
            if line.contains("hccn_backend_hccl::install()") {
                continue;
            }
            let dispatch =
                ["Hccl(", "HcclCommunicator", "HcclBucket", "AclStream", "hccn_backend_hccl", "BackendKind::"];
            assert!(
                !dispatch.iter().any(|d| line.contains(d)),
                "{}: {line:?}: the C ABI reaches a backend only through hccn_runtime::backend",
                f.display()
            );
        }
    }
}
