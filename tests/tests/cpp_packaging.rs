//! C and C++ users' route, as they would take it: `scripts/install.sh --prefix DIR` installs the
//! library, headers, `hccn.pc` and the CMake package config; examples/c is built with
//! `pkg-config --cflags --libs hccn`, examples/cpp with CMake through `find_package(hccn)` (both
//! the shared and the static target), and every program runs with 2 ranks under the installed
//! `hccnrun`. Nothing is taken from the source tree after the install except the examples.
//!
//! Needs the release build first (`cargo build --release`), and cmake/pkg-config
//! (scripts/setup.sh installs them).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hccn_tests::launch::{self, Outcome};

/// Hard limit for one build step (install, configure, compile).
const BUILD_TIMEOUT: Duration = Duration::from_secs(300);
/// Hard limit for one 2-rank run.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

fn root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// A fresh directory, removed when the test passes (kept for a look when it fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("hccn-{what}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A command that sees only what a user's shell would: no cargo-provided LD_LIBRARY_PATH, so a
/// program finds libhccn.so through the installed prefix alone.
fn clean(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_remove("LD_LIBRARY_PATH");
    cmd
}

fn must(out: Outcome, what: &str) -> Outcome {
    assert_eq!(out.code, Some(0), "{what} failed: {}", out.describe());
    out
}

/// The shared libraries `program` loads, as a user's shell would resolve them.
fn ldd(program: &Path) -> String {
    let mut cmd = clean("ldd");
    cmd.arg(program);
    must(launch::run(cmd, BUILD_TIMEOUT), "ldd").stdout
}

/// Installs into a fresh prefix from this build's library and tools.
fn install(prefix: &Path) {
    let mut cmd = clean("bash");
    cmd.arg(root().join("scripts/install.sh")).arg("--prefix").arg(prefix).arg("--from").arg(launch::bin_dir());
    must(launch::run(cmd, BUILD_TIMEOUT), "scripts/install.sh");
    for f in [
        "lib/libhccn.so",
        "lib/libhccn.a",
        "include/hccn.h",
        "include/hccn.hpp",
        "lib/pkgconfig/hccn.pc",
        "lib/cmake/hccn/hccnConfig.cmake",
        "lib/cmake/hccn/hccnConfigVersion.cmake",
        "bin/hccnrun",
    ] {
        assert!(prefix.join(f).exists(), "install.sh did not install {f}");
    }
}

/// Runs `program` on 2 ranks under the installed hccnrun and checks each rank's `ok` line.
fn run_two_ranks(prefix: &Path, program: &Path, ok_line: &str) {
    let mut cmd = clean(prefix.join("bin/hccnrun"));
    cmd.args(["-n", "2", "--"]).arg(program);
    let out = launch::run(cmd, RUN_TIMEOUT);
    assert_eq!(out.code, Some(0), "{} on 2 ranks: {}", program.display(), out.describe());
    for r in 0..2 {
        let want = format!("rank {r} of 2: {ok_line}");
        assert!(out.stdout.contains(&want), "no {want:?} from {}: {}", program.display(), out.describe());
    }
    assert!(!out.stdout.contains("WRONG"), "{}", out.describe());
}

#[test]
fn c_example_builds_with_pkg_config_and_runs_on_two_ranks() {
    let tmp = TempDir::new("pkgconfig");
    let prefix = tmp.0.join("prefix");
    install(&prefix);

    let mut pc = clean("pkg-config");
    pc.args(["--cflags", "--libs", "hccn"]).env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"));
    let flags = must(launch::run(pc, BUILD_TIMEOUT), "pkg-config --cflags --libs hccn").stdout;
    assert!(flags.contains(&format!("-I{}", prefix.join("include").display())), "{flags}");
    assert!(flags.contains("-lhccn"), "{flags}");

    let program = tmp.0.join("allreduce");
    let mut cc = clean("gcc");
    cc.args(["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(root().join("examples/c/allreduce.c"))
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(&program);
    must(launch::run(cc, BUILD_TIMEOUT), "gcc examples/c/allreduce.c $(pkg-config --cflags --libs hccn)");
    run_two_ranks(&prefix, &program, "allreduce of 1024 floats ok (data[1023] = 3069)");

    // `pkg-config --static` names what libhccn.a needs: a program linked with it alone runs.
    let mut pc = clean("pkg-config");
    pc.args(["--static", "--cflags", "--libs", "hccn"]).env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"));
    let flags = must(launch::run(pc, BUILD_TIMEOUT), "pkg-config --static").stdout;
    let static_program = tmp.0.join("allreduce_static");
    let mut cc = clean("gcc");
    cc.args(["-std=c99", "-O2"])
        .arg(root().join("examples/c/allreduce.c"))
        .arg(prefix.join("lib/libhccn.a"))
        .args(flags.split_whitespace().filter(|f| *f != "-lhccn"))
        .arg("-o")
        .arg(&static_program);
    must(launch::run(cc, BUILD_TIMEOUT), "static link with pkg-config --static");
    let deps = ldd(&static_program);
    assert!(!deps.contains("libhccn"), "the static program still loads libhccn.so: {deps}");
    run_two_ranks(&prefix, &static_program, "allreduce of 1024 floats ok");
}

#[test]
fn cpp_example_builds_with_cmake_find_package_and_runs_on_two_ranks() {
    let tmp = TempDir::new("cmake");
    let prefix = tmp.0.join("prefix");
    install(&prefix);

    // hccn.hpp's type mapping and API shape, checked at compile time with strict warnings.
    let mut cxx = clean("g++");
    cxx.args(["-std=c++17", "-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Werror"])
        .arg(format!("-I{}", prefix.join("include").display()))
        .arg(root().join("tests/cpp/types.cpp"))
        .arg(format!("-L{}", prefix.join("lib").display()))
        .arg("-lhccn")
        .arg("-o")
        .arg(tmp.0.join("types"));
    must(launch::run(cxx, BUILD_TIMEOUT), "g++ tests/cpp/types.cpp");

    let build = tmp.0.join("build");
    let mut configure = clean("cmake");
    configure
        .arg("-S")
        .arg(root().join("examples/cpp"))
        .arg("-B")
        .arg(&build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .arg("-DCMAKE_BUILD_TYPE=Release");
    must(launch::run(configure, BUILD_TIMEOUT), "cmake configure of examples/cpp (find_package(hccn))");
    let mut make = clean("cmake");
    make.arg("--build").arg(&build);
    must(launch::run(make, BUILD_TIMEOUT), "cmake --build examples/cpp");

    let ok = "C++ allreduce ok (grad[1023] = 3069, counts[0] = 3)";
    run_two_ranks(&prefix, &build.join("allreduce_cpp"), ok);
    run_two_ranks(&prefix, &build.join("allreduce_cpp_static"), ok);

    // The shared build found the installed library, the static one needs none.
    let shared = ldd(&build.join("allreduce_cpp"));
    assert!(shared.contains(&prefix.join("lib/libhccn.so").display().to_string()), "{shared}");
    assert!(!ldd(&build.join("allreduce_cpp_static")).contains("libhccn"));
}
