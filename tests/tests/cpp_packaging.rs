//! C and C++ users' route, as they would take it. The release tarball (scripts/release.sh) is
//! unpacked, checked against its SHA256SUMS and installed by its own install.sh into a clean
//! prefix with an environment that has no cargo or rustc; examples/c is built with pkg-config
//! (hccn.pc shared, hccn-static.pc static), examples/cpp with CMake through `find_package(hccn)`
//! (both targets), and every program runs with 2 ranks under the installed `hccnrun`. The
//! installed library is checked as a distribution would: stripped, under 10 MB, soname
//! `libhccn.so.1` with the usual link, only `hccn_*` exported. The tarball's README names only
//! paths the tarball holds, and it carries the TensorFlow and MindSpore bindings' sources. The source tree's install.sh is
//! checked too (from a build, with --debug-symbols, and without a build or cargo).
//!
//! Needs the release build first (`cargo build --release`), and binutils, cmake and pkg-config
//! (scripts/setup.sh installs them).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hccn_tests::launch;
use hccn_tests::scratch::{bare, clean, must, on_system_path, root, run_ok, workspace_version, TempDir};

/// Hard limit for one build step (release, install, configure, compile).
const BUILD_TIMEOUT: Duration = Duration::from_secs(300);
/// Hard limit for one 2-rank run.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The shared example's output on each rank.
const C_OK: &str = "allreduce of 1024 floats ok (data[1023] = 3069)";
const CPP_OK: &str = "C++ allreduce ok (grad[1023] = 3069, counts[0] = 3)";

/// The shared libraries `program` loads, as a user's shell would resolve them.
fn ldd(program: &Path) -> String {
    let mut cmd = clean("ldd");
    cmd.arg(program);
    run_ok(cmd, BUILD_TIMEOUT, "ldd").stdout
}

/// `readelf -d` of an ELF file (its soname and the libraries it needs).
fn dynamic_section(file: &Path) -> String {
    let mut cmd = clean("readelf");
    cmd.arg("-d").arg(file);
    run_ok(cmd, BUILD_TIMEOUT, "readelf -d").stdout
}

/// Makes the release tarball from this build, unpacks it under `dir`, checks its checksums and
/// returns the unpacked tree.
fn unpacked_release(dir: &Path) -> PathBuf {
    let out = dir.join("dist");
    let mut cmd = clean("bash");
    cmd.arg(root().join("scripts/release.sh")).arg("--out").arg(&out).arg("--from").arg(launch::bin_dir());
    run_ok(cmd, BUILD_TIMEOUT, "scripts/release.sh");

    let name = format!("hccn-{}-linux-{}", workspace_version(), std::env::consts::ARCH);
    let tarball = out.join(format!("{name}.tar.gz"));
    let mut sum = clean("sha256sum");
    sum.arg("-c").arg(format!("{name}.tar.gz.sha256")).current_dir(&out);
    run_ok(sum, BUILD_TIMEOUT, "sha256sum -c of the tarball");

    let unpack = dir.join("unpack");
    std::fs::create_dir_all(&unpack).expect("mkdir");
    let mut tar = clean("tar");
    tar.arg("-xzf").arg(&tarball).arg("-C").arg(&unpack);
    run_ok(tar, BUILD_TIMEOUT, "tar -xzf");
    let tree = unpack.join(&name);
    let mut sums = clean("sha256sum");
    sums.args(["-c", "--quiet", "SHA256SUMS"]).current_dir(&tree);
    run_ok(sums, BUILD_TIMEOUT, "sha256sum -c SHA256SUMS inside the tarball");
    for f in
        ["install.sh", "debug/libhccn.so.1.debug", "share/doc/hccn/README.md", "share/doc/hccn/examples/c/allreduce.c"]
    {
        assert!(tree.join(f).exists(), "the tarball lacks {f}");
    }
    check_tarball_readme(&tree);
    tree
}

/// The tarball's README.md names only what the tarball holds (every word that starts with
/// bin/, lib/, include/, share/ or debug/, and install.sh), and the TensorFlow and MindSpore
/// bindings' sources are there with an executable build.sh.
fn check_tarball_readme(tree: &Path) {
    let readme = std::fs::read_to_string(tree.join("README.md")).expect("the tarball's README.md");
    let mut named = 0;
    for word in readme.split(|c: char| c.is_whitespace() || "`|(),;".contains(c)) {
        let path = word.trim_start_matches("./").trim_end_matches(['.', ':']);
        if ["bin/", "lib/", "include/", "share/", "debug/"].iter().any(|p| path.starts_with(p)) || path == "install.sh"
        {
            named += 1;
            assert!(tree.join(path).exists(), "the tarball's README names {path}, which the tarball lacks");
        }
    }
    assert!(named >= 20, "the tarball's README names only {named} paths of the tarball");
    for binding in ["tensorflow", "mindspore"] {
        let dir = tree.join("share/hccn/bindings").join(binding);
        let sources = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        assert!(sources >= 4, "{} holds {sources} entries: the {binding} binding's sources are missing", dir.display());
        let mode = std::fs::metadata(dir.join("build.sh")).map(|m| m.permissions().mode()).unwrap_or(0);
        assert!(mode & 0o111 != 0, "{}/build.sh is not executable", dir.display());
    }
}

/// Installs from the unpacked tarball as a user without Rust: its own install.sh, a bare
/// environment (no cargo, no rustc on PATH).
fn install_from_tarball(tree: &Path, prefix: &Path, home: &Path) {
    assert!(on_system_path("cargo").is_none(), "cargo is on the system PATH; this test needs a PATH without it");
    let mut cmd = bare("bash", None, home);
    cmd.arg(tree.join("install.sh")).arg("--prefix").arg(prefix);
    run_ok(cmd, BUILD_TIMEOUT, "install.sh from the release tarball");
    for f in [
        "lib/libhccn.so.1",
        "lib/libhccn.so",
        "lib/libhccn.a",
        "include/hccn.h",
        "include/hccn.hpp",
        "lib/pkgconfig/hccn.pc",
        "lib/pkgconfig/hccn-static.pc",
        "lib/cmake/hccn/hccnConfig.cmake",
        "lib/cmake/hccn/hccnConfigVersion.cmake",
        "bin/hccnrun",
        "bin/hccn-perf",
        "bin/hccn-trace",
        "bin/hccn-info",
    ] {
        assert!(prefix.join(f).exists(), "install.sh did not install {f}");
    }
    assert!(!prefix.join("lib/.debug").exists(), "debug symbols are installed only when asked");
}

/// The installed library as a distribution ships it.
fn check_installed_library(prefix: &Path) {
    let lib = prefix.join("lib/libhccn.so.1");
    let size = std::fs::metadata(&lib).map(|m| m.len()).unwrap_or(u64::MAX);
    assert!(size < 10 << 20, "{} is {size} bytes; the target is under 10 MB", lib.display());
    let link = std::fs::read_link(prefix.join("lib/libhccn.so")).expect("lib/libhccn.so is a symlink");
    assert_eq!(link, Path::new("libhccn.so.1"));

    let dynamic = dynamic_section(&lib);
    assert!(dynamic.contains("Library soname: [libhccn.so.1]"), "{dynamic}");
    // What the library needs from the system: the C library and the unwinder, nothing else.
    let needed: Vec<&str> = dynamic.lines().filter_map(|l| l.split("Shared library: [").nth(1)).collect();
    for n in &needed {
        assert!(
            ["libc.so.6]", "libgcc_s.so.1]", "ld-linux-x86-64.so.2]", "ld-linux-aarch64.so.1]"].contains(n),
            "unexpected dependency {n} of {}: {dynamic}",
            lib.display()
        );
    }

    let mut sections = clean("readelf");
    sections.arg("-S").arg(&lib);
    let sections = run_ok(sections, BUILD_TIMEOUT, "readelf -S").stdout;
    assert!(!sections.contains(".debug_info"), "the installed library still carries debug information");
    assert!(sections.contains(".gnu_debuglink"), "no debuglink: install.sh --debug-symbols could not help gdb");

    let mut nm = clean("nm");
    nm.arg("-D").arg(&lib);
    let symbols = run_ok(nm, BUILD_TIMEOUT, "nm -D").stdout;
    let (mut exported, mut foreign) = (0, Vec::new());
    for line in symbols.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (kind, name) = match fields.as_slice() {
            [_, kind, name] => (*kind, *name),
            [kind, name] => (*kind, *name),
            _ => continue,
        };
        let defined = !matches!(kind, "U" | "w" | "v");
        if defined {
            if name.starts_with("hccn_") {
                exported += 1;
            } else {
                foreign.push(line.to_owned());
            }
            continue;
        }
        // Imports: versioned references into glibc and libgcc_s (the unwinder behind Rust's
        // panics), and the weak hooks every shared object's crt files carry (transactional
        // memory, gprof, __cxa_finalize), which the linker adds and nothing defines.
        let versioned = name.contains("@GLIBC_") || name.contains("@GCC_");
        let crt = ["_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__gmon_start__"].contains(&name);
        if !versioned && !crt {
            foreign.push(line.to_owned());
        }
    }
    assert!(exported > 40, "only {exported} hccn_* functions exported: {symbols}");
    assert!(foreign.is_empty(), "nm -D shows symbols that are neither hccn_* nor system imports: {foreign:?}");
}

/// `pkg-config ARGS` against the installed prefix.
fn pkg_config(prefix: &Path, args: &[&str]) -> String {
    let mut pc = clean("pkg-config");
    pc.args(args).env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"));
    run_ok(pc, BUILD_TIMEOUT, &format!("pkg-config {}", args.join(" "))).stdout
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

/// examples/c with `pkg-config --cflags --libs hccn` (shared) and `hccn-static` (static).
fn c_example_with_pkg_config(prefix: &Path, dir: &Path) {
    let flags = pkg_config(prefix, &["--cflags", "--libs", "hccn"]);
    assert!(flags.contains(&format!("-I{}", prefix.join("include").display())), "{flags}");
    assert!(flags.contains("-lhccn"), "{flags}");
    let program = dir.join("allreduce");
    let mut cc = clean("gcc");
    cc.args(["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(root().join("examples/c/allreduce.c"))
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(&program);
    must(launch::run(cc, BUILD_TIMEOUT), "gcc examples/c/allreduce.c $(pkg-config --cflags --libs hccn)");
    let dynamic = dynamic_section(&program);
    assert!(dynamic.contains("Shared library: [libhccn.so.1]"), "the program should need the soname: {dynamic}");
    assert!(ldd(&program).contains(&prefix.join("lib/libhccn.so.1").display().to_string()));
    run_two_ranks(prefix, &program, C_OK);

    // `--static` on hccn.pc adds the archive's system libraries (Libs.private) ...
    let private = pkg_config(prefix, &["--static", "--libs", "hccn"]);
    assert!(private.contains("-lgcc_s") && private.contains("-ldl") && private.contains("-lpthread"), "{private}");
    // ... and hccn-static.pc links the archive itself: a program that needs no libhccn.so.
    let flags = pkg_config(prefix, &["--cflags", "--libs", "hccn-static"]);
    let static_program = dir.join("allreduce_static");
    let mut cc = clean("gcc");
    cc.args(["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(root().join("examples/c/allreduce.c"))
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(&static_program);
    must(launch::run(cc, BUILD_TIMEOUT), "gcc examples/c/allreduce.c $(pkg-config --cflags --libs hccn-static)");
    let deps = ldd(&static_program);
    assert!(!deps.contains("libhccn"), "the static program still loads libhccn.so: {deps}");
    run_two_ranks(prefix, &static_program, C_OK);
}

/// examples/cpp with CMake (`find_package(hccn)`: hccn::hccn and hccn::hccn_static), and
/// hccn.hpp's type mapping compiled with strict warnings.
fn cpp_example_with_cmake(prefix: &Path, dir: &Path) {
    let mut cxx = clean("g++");
    cxx.args(["-std=c++17", "-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Werror"])
        .arg(format!("-I{}", prefix.join("include").display()))
        .arg(root().join("tests/cpp/types.cpp"))
        .arg(format!("-L{}", prefix.join("lib").display()))
        .arg("-lhccn")
        .arg("-o")
        .arg(dir.join("types"));
    must(launch::run(cxx, BUILD_TIMEOUT), "g++ tests/cpp/types.cpp");

    let build = dir.join("build");
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

    run_two_ranks(prefix, &build.join("allreduce_cpp"), CPP_OK);
    run_two_ranks(prefix, &build.join("allreduce_cpp_static"), CPP_OK);
    // The shared build found the installed library, the static one needs none.
    let shared = ldd(&build.join("allreduce_cpp"));
    assert!(shared.contains(&prefix.join("lib/libhccn.so.1").display().to_string()), "{shared}");
    assert!(!ldd(&build.join("allreduce_cpp_static")).contains("libhccn"));
}

#[test]
fn release_tarball_installs_without_cargo_and_the_examples_build_against_it() {
    let tmp = TempDir::new("release");
    let tree = unpacked_release(tmp.path());
    let prefix = tmp.path().join("prefix");
    install_from_tarball(&tree, &prefix, tmp.path());
    check_installed_library(&prefix);
    c_example_with_pkg_config(&prefix, tmp.path());
    cpp_example_with_cmake(&prefix, tmp.path());

    // The unpacked tree works in place too: its pkg-config files are relative to themselves.
    let flags = pkg_config(&tree, &["--cflags", "hccn"]);
    let include = PathBuf::from(flags.trim().trim_start_matches("-I"));
    assert!(include.join("hccn.h").exists(), "in-place pkg-config points at {}", include.display());
    // --debug-symbols adds the separate debug file where gdb looks (lib/.debug/).
    let mut cmd = bare("bash", None, tmp.path());
    cmd.arg(tree.join("install.sh")).arg("--prefix").arg(&prefix).arg("--debug-symbols");
    run_ok(cmd, BUILD_TIMEOUT, "install.sh --debug-symbols from the tarball");
    assert!(prefix.join("lib/.debug/libhccn.so.1.debug").exists());
}

#[test]
fn install_from_the_source_tree_strips_and_splits_debug_symbols() {
    let tmp = TempDir::new("srcinstall");
    let prefix = tmp.path().join("prefix");
    let mut cmd = clean("bash");
    cmd.arg(root().join("scripts/install.sh"))
        .arg("--prefix")
        .arg(&prefix)
        .arg("--from")
        .arg(launch::bin_dir())
        .arg("--debug-symbols");
    run_ok(cmd, BUILD_TIMEOUT, "scripts/install.sh --from target/release --debug-symbols");
    check_installed_library(&prefix);
    let debug = prefix.join("lib/.debug/libhccn.so.1.debug");
    let mut sections = clean("readelf");
    sections.arg("-S").arg(&debug);
    let sections = run_ok(sections, BUILD_TIMEOUT, "readelf -S of the debug file").stdout;
    assert!(sections.contains(".debug_info") && sections.contains(".symtab"), "{sections}");
    let pc = std::fs::read_to_string(prefix.join("lib/pkgconfig/hccn.pc")).expect("hccn.pc");
    assert!(pc.contains(&format!("prefix={}\n", prefix.display())), "{pc}");
    assert!(pc.contains(&format!("Version: {}\n", workspace_version())), "{pc}");
    c_example_with_pkg_config(&prefix, tmp.path());
}

#[test]
fn install_sh_explains_itself_and_what_to_do_without_a_build_or_cargo() {
    let tmp = TempDir::new("noinstall");
    let mut help = clean("bash");
    help.arg(root().join("scripts/install.sh")).arg("--help");
    let help = run_ok(help, BUILD_TIMEOUT, "install.sh --help").stdout;
    assert!(help.starts_with("usage: install.sh --prefix DIR"), "{help}");
    assert!(
        help.contains("--debug-symbols") && help.contains("--from BUILD_DIR") && help.contains("tarball"),
        "{help}"
    );
    assert!(!help.contains("set -euo"), "--help prints the script itself: {help}");

    // A source tree with no build, on a machine without cargo.
    let tree = tmp.path().join("src");
    std::fs::create_dir_all(tree.join("scripts")).expect("mkdir");
    std::fs::copy(root().join("scripts/install.sh"), tree.join("scripts/install.sh")).expect("copy install.sh");
    std::fs::write(tree.join("Cargo.toml"), "[workspace.package]\nversion = \"9.9.9\"\n").expect("Cargo.toml");
    assert!(on_system_path("cargo").is_none(), "cargo is on the system PATH; this test needs a PATH without it");
    let mut cmd = bare("bash", None, tmp.path());
    cmd.arg(tree.join("scripts/install.sh")).arg("--prefix").arg(tmp.path().join("prefix"));
    let out = launch::run(cmd, BUILD_TIMEOUT);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    for needle in ["no build of hccn", "no cargo on PATH", "release tarball", "install.sh --prefix DIR", "--from"] {
        assert!(out.stderr.contains(needle), "no {needle:?} in: {}", out.describe());
    }
    assert!(!out.stderr.contains("command not found"), "{}", out.describe());

    let mut bad = clean("bash");
    bad.arg(root().join("scripts/install.sh")).arg("--prefx").arg("x");
    let out = launch::run(bad, BUILD_TIMEOUT);
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(out.stderr.contains("unknown argument --prefx") && out.stderr.contains("usage:"), "{}", out.describe());
}

#[test]
fn hccn_hpp_below_cpp17_says_it_needs_cpp17() {
    let tmp = TempDir::new("cxx14");
    let src = tmp.path().join("use.cpp");
    std::fs::write(&src, "#include <hccn.hpp>\nint main() { return 0; }\n").expect("write");
    let compile = |std: &str| {
        let mut cxx = clean("g++");
        cxx.arg(format!("-std={std}"))
            .arg("-fsyntax-only")
            .arg(format!("-I{}", root().join("include").display()))
            .arg(&src);
        launch::run(cxx, BUILD_TIMEOUT)
    };
    for std in ["c++11", "c++14", "gnu++14"] {
        let out = compile(std);
        assert_ne!(out.code, Some(0), "-std={std} compiled: {}", out.describe());
        let first_error = out.stderr.lines().find(|l| l.contains("error")).unwrap_or_default();
        assert!(first_error.contains("hccn.hpp needs C++17 or later"), "-std={std}: {}", out.describe());
        let errors = out.stderr.lines().filter(|l| l.contains(": error:")).count();
        assert_eq!(errors, 1, "-std={std}: the #error alone, not the standard library's: {}", out.describe());
    }
    must(compile("c++17"), "g++ -std=c++17 with hccn.hpp");
    must(compile("c++20"), "g++ -std=c++20 with hccn.hpp");
}
