//! Gives libhccn.so its versioned soname, `libhccn.so.1` (C ABI v1, see include/hccn.h): a
//! program linked with `-lhccn` records `libhccn.so.1`, so an incompatible ABI (`.so.2`) can
//! never be picked up by it. Installs (scripts/install.sh) carry the usual links
//! `libhccn.so -> libhccn.so.1`; in the build directory this script makes the same link
//! `libhccn.so.1 -> libhccn.so`, so programs linked against target/<profile> still start.

use std::path::{Path, PathBuf};

/// The ABI major version: bump with any incompatible change to include/hccn.h.
const ABI: u32 = 1;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os != "linux" {
        return;
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libhccn.so.{ABI}");
    if let Some(dir) = std::env::var_os("OUT_DIR").map(PathBuf::from).as_deref().and_then(profile_dir) {
        link_soname_in(&dir);
    }
}

/// target/<profile> (or target/<triple>/<profile>): the parent of the `build` directory that
/// holds OUT_DIR.
fn profile_dir(out_dir: &Path) -> Option<PathBuf> {
    out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .map(Path::to_path_buf)
}

/// `libhccn.so.1 -> libhccn.so` next to where cargo puts the library (dangling until the first
/// link, which is fine for a symlink).
fn link_soname_in(dir: &Path) {
    let link = dir.join(format!("libhccn.so.{ABI}"));
    if link.symlink_metadata().is_ok() {
        return;
    }
    if let Err(e) = std::os::unix::fs::symlink("libhccn.so", &link) {
        println!("cargo:warning=could not link {} -> libhccn.so: {e}", link.display());
    }
}
