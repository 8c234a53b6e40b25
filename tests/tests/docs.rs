//! The project's own rules that code can check: every HCCN_* variable is parsed in config.rs
//! only and listed in the README's one table.

use std::path::{Path, PathBuf};

use hccn_runtime::config::VARIABLES;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn readme_table_lists_every_variable() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    for v in VARIABLES {
        let row = format!("| `{}` |", v.name);
        assert!(readme.contains(&row), "README.md's variable table lacks a row for {}", v.name);
    }
}

#[test]
fn variables_are_read_only_in_config_rs() {
    let mut files = Vec::new();
    for dir in ["runtime/src", "capi/src", "tools/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    for f in files {
        if f.ends_with("config.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for pat in ["var(\"HCCN_", "var_os(\"HCCN_"] {
            assert!(
                !text.contains(pat),
                "{} reads an HCCN_* variable itself; parse it in runtime/src/config.rs",
                f.display()
            );
        }
    }
}
