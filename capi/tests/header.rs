//! `include/hccn.h` is generated from this crate and committed: this test regenerates it and fails
//! when the committed file differs. `HCCN_UPDATE_HEADER=1` rewrites it instead
//! (scripts/gen-header.sh).

use std::path::PathBuf;

fn generate() -> String {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    config.after_includes = Some(format!("\n{}", hccn::header_enums()));
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    String::from_utf8(out).expect("header is UTF-8")
}

#[test]
fn committed_header_is_current() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../include/hccn.h");
    let fresh = generate();
    if std::env::var_os("HCCN_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write include/hccn.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(committed == fresh, "include/hccn.h is stale: run scripts/gen-header.sh and commit the result");
}

#[test]
fn header_declares_the_contract() {
    let h = generate();
    for needle in [
        "typedef struct hccn_comm hccn_comm;",
        "typedef struct hccn_stream hccn_stream;",
        "typedef struct hccn_event hccn_event;",
        "typedef struct hccn_bucket hccn_bucket;",
        "hccn_result hccn_bucket_add(struct hccn_bucket *bucket,",
        "hccn_result hccn_allreduce_compressed(const void *sendbuf,",
        "uint8_t internal[128];",
        "HCCN_ERROR_STALE_EPOCH = 106,",
        "HCCN_BF16 = 11,",
        "HCCN_AVG = 4,",
        "hccn_result hccn_allreduce(const void *sendbuf,",
        "hccn_datatype dt,",
    ] {
        assert!(h.contains(needle), "header lacks {needle:?}");
    }
}

#[test]
fn the_python_result_codes_are_the_runtime_table() {
    // bindings/python/hccn/_raw.py keeps its own enum (it loads the library with ctypes): every
    // code of the one table must be there with its number, and nothing else.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let py = std::fs::read_to_string(root.join("bindings/python/hccn/_raw.py")).expect("_raw.py");
    let body = py.split("class Result(").nth(1).expect("a Result enum in _raw.py");
    let body = body.split("\nclass ").next().unwrap_or(body);
    let mut found: Vec<(String, u32)> = body
        .lines()
        .filter_map(|l| {
            let (name, value) = l.trim().split_once(" = ")?;
            Some((format!("HCCN_{name}"), value.trim().parse().ok()?))
        })
        .collect();
    found.sort_by_key(|(_, v)| *v);
    let want: Vec<(String, u32)> =
        hccn_runtime::error::RESULT_CODES.iter().map(|(_, name, code, _)| (name.to_string(), *code)).collect();
    assert_eq!(found, want, "bindings/python/hccn/_raw.py's Result enum must match RESULT_CODES");
}
