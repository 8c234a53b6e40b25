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
