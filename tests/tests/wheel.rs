//! The Python user's route: `pip wheel bindings/python` builds a wheel that carries libhccn and
//! the tools; it installs into a fresh venv, and from there, in an environment with no Rust
//! toolchain (no cargo or rustc on PATH, no HCCN_LIB, not even the repository on sys.path), the
//! wheel's own `hccnrun` runs the package's tests on 2 ranks, `hccn-perf` checks an allreduce
//! sweep, and the other tools start.
//!
//! The wheel's platform tag (manylinux_2_N, computed by setup.py from what the library and tools
//! need of glibc) is checked with auditwheel.
//!
//! The torch user's route: `scripts/release.sh --wheel`, where the pinned torch is installed,
//! makes the one wheel, which then carries torch's "hccn" backend; installed into a fresh venv
//! that has that torch, it runs 2-rank torch jobs under torchrun and its own hccnrun.
//!
//! Needs the release build (`cargo build --release`) and a python3 with venv; the torch test
//! needs the torch venv (scripts/setup-python.sh torch). numpy and setuptools (pinned in
//! scripts/setup-python.sh) and auditwheel come from a wheelhouse in target/wheelhouse,
//! downloaded from PyPI on the first run only, so later runs need no network.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hccn_tests::launch::{self, Outcome};
use hccn_tests::scratch::{bare, clean, on_system_path, root, run_ok, workspace_version, TempDir};
use hccn_tests::torch;

/// PyPA's wheel checker, for the platform tag.
const AUDITWHEEL: &str = "auditwheel==6.8.2";
/// Hard limit for one step (venv, download, build, install).
const STEP_TIMEOUT: Duration = Duration::from_secs(600);
/// Hard limit for one 2-rank run.
const RUN_TIMEOUT: Duration = Duration::from_secs(180);
/// Hard limit for a release that compiles the torch backend (when target/torch-ext is stale):
/// 1.5-6 minutes on the loaded 2-core machine.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// torch's libraries, which the torch backend links and the torch the wheel pins provides.
const TORCH_LIBS: [&str; 4] = ["libc10.so", "libtorch_cpu.so", "libtorch.so", "libtorch_python.so"];

/// One build from bindings/python at a time: setuptools builds in bindings/python/build, and
/// both tests download into the same wheelhouse.
static BUILDING: Mutex<()> = Mutex::new(());

/// A `NAME="pkg==version"` pin of scripts/setup-python.sh, so the venvs agree on versions.
fn pin(var: &str) -> String {
    let script = std::fs::read_to_string(root().join("scripts/setup-python.sh")).expect("setup-python.sh");
    script
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{var}=\"")))
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no {var} in scripts/setup-python.sh"))
        .to_owned()
}

/// `python -m venv DIR` with the test's python3.
fn venv(dir: &Path) -> PathBuf {
    let mut cmd = clean("python3");
    cmd.args(["-m", "venv"]).arg(dir);
    run_ok(cmd, STEP_TIMEOUT, "python3 -m venv (scripts/setup-python.sh installs python3-venv)");
    dir.join("bin")
}

/// target/wheelhouse with the pinned numpy (for `python`'s version) and setuptools; fetched
/// with `pip download` only when missing.
fn wheelhouse(pip: &Path, python: &Path, pins: &[String]) -> PathBuf {
    let dir = launch::bin_dir().parent().map(|t| t.join("wheelhouse")).expect("target dir");
    let mut tag = clean(python);
    tag.args(["-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"]);
    let tag = run_ok(tag, STEP_TIMEOUT, "python version").stdout.trim().to_owned();
    let have = |pin: &str| {
        let prefix = pin.replace("==", "-");
        std::fs::read_dir(&dir).into_iter().flatten().flatten().any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&format!("{prefix}-")) && (name.contains("-py3-none-") || name.contains(&tag))
        })
    };
    let missing: Vec<&String> = pins.iter().filter(|p| !have(p)).collect();
    if !missing.is_empty() {
        let mut cmd = clean(pip);
        cmd.args(["download", "--disable-pip-version-check", "--dest"]).arg(&dir).args(&missing);
        run_ok(cmd, STEP_TIMEOUT, "pip download into target/wheelhouse (PyPI, first run only)");
    }
    dir
}

/// The one wheel in `dir`.
fn only_wheel(dir: &Path) -> PathBuf {
    let wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "whl"))
        .collect();
    assert_eq!(wheels.len(), 1, "one wheel expected in {}: {wheels:?}", dir.display());
    wheels[0].clone()
}

/// `auditwheel show --json` of `wheel`, with auditwheel installed into `bin`'s venv from the
/// wheelhouse.
fn auditwheel(bin: &Path, house: &Path, wheel: &Path) -> serde_json::Value {
    let mut install = clean(bin.join("pip"));
    install.args(["install", "--disable-pip-version-check", "--no-index", "--find-links"]).arg(house).arg(AUDITWHEEL);
    run_ok(install, STEP_TIMEOUT, "pip install auditwheel");
    let mut show = clean(bin.join("auditwheel"));
    show.args(["show", "--json"]).arg(wheel);
    let shown = run_ok(show, STEP_TIMEOUT, "auditwheel show").stdout;
    serde_json::from_str(&shown).unwrap_or_else(|e| panic!("auditwheel show --json: {e}: {shown}"))
}

/// Reads the names inside a wheel (a zip file) with the standard library's zipfile.
fn wheel_contents(python: &Path, wheel: &Path) -> String {
    let mut cmd = clean(python);
    cmd.args([
        "-c",
        "import sys, zipfile; [print(i.filename, i.file_size) for i in zipfile.ZipFile(sys.argv[1]).infolist()]",
    ])
    .arg(wheel);
    run_ok(cmd, STEP_TIMEOUT, "listing the wheel").stdout
}

/// The `hccnrun` line of the README's block marked `covered-by=tests/tests/wheel.rs`.
fn readme_python_line() -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let block = readme.split("```sh covered-by=tests/tests/wheel.rs\n").nth(1).expect("the README's wheel block");
    let block = block.split("```").next().unwrap_or_default();
    let line = block.lines().find(|l| l.starts_with("hccnrun ")).expect("an hccnrun line in the README's wheel block");
    line.to_owned()
}

fn expect_ok(out: &Outcome, what: &str) {
    assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
}

#[test]
fn wheel_installs_in_a_fresh_venv_and_runs_multi_rank_jobs_without_rust() {
    let tmp = TempDir::new("wheel");
    let version = workspace_version();
    let numpy = pin("NUMPY_PIN");
    let setuptools = pin("SETUPTOOLS_PIN");

    // Build: `pip wheel bindings/python` in its own venv, isolated build backend from the
    // wheelhouse (as a user's pip would from PyPI).
    let build_bin = venv(&tmp.path().join("build-venv"));
    let pins = [numpy.clone(), setuptools, AUDITWHEEL.to_owned()];
    let building = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let house = wheelhouse(&build_bin.join("pip"), &build_bin.join("python"), &pins);
    let dist = tmp.path().join("dist");
    let mut cmd = clean(build_bin.join("pip"));
    cmd.args(["wheel", "--disable-pip-version-check", "--no-deps", "--wheel-dir"])
        .arg(&dist)
        .arg(root().join("bindings/python"))
        .env("PIP_NO_INDEX", "1")
        .env("PIP_FIND_LINKS", &house)
        .env("HCCN_BUILD_DIR", launch::bin_dir());
    run_ok(cmd, STEP_TIMEOUT, "pip wheel bindings/python");
    drop(building);
    let wheel = only_wheel(&dist);
    let name = wheel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tag = name
        .strip_prefix(&format!("hccn-{version}-py3-none-"))
        .and_then(|t| t.strip_suffix(".whl"))
        .unwrap_or_else(|| panic!("{name} is not hccn-{version}-py3-none-PLATFORM.whl"));
    assert!(
        tag.starts_with("manylinux_2_") && tag.ends_with(&format!("_{}", std::env::consts::ARCH)),
        "{name}: the library and tools need more than manylinux allows (setup.py fell back to linux_*)"
    );
    // auditwheel, PyPA's own checker, agrees with the tag setup.py computed.
    let audit = auditwheel(&build_bin, &house, &wheel);
    assert_eq!(audit["overall_tag"], tag, "auditwheel: {audit}");
    let size = std::fs::metadata(&wheel).map(|m| m.len()).unwrap_or(u64::MAX);
    assert!(size < 20 << 20, "the wheel is {size} bytes: debug information left in?");
    let contents = wheel_contents(&build_bin.join("python"), &wheel);
    for f in
        ["hccn/lib/libhccn.so.1", "hccn/bin/hccnrun", "hccn/bin/hccn-perf", "hccn/bin/hccn-trace", "hccn/bin/hccn-info"]
    {
        assert!(contents.lines().any(|l| l.starts_with(&format!("{f} "))), "the wheel lacks {f}: {contents}");
    }
    for f in ["hccn/include/hccn.h", "hccn/include/hccn.hpp", "hccn/_cli.py"] {
        assert!(contents.contains(f), "the wheel lacks {f}: {contents}");
    }

    // Install: a fresh venv, nothing of this environment (no cargo on PATH, no HCCN_LIB).
    let user = tmp.path().join("user-venv");
    let user_bin = venv(&user);
    assert!(on_system_path("cargo").is_none() && on_system_path("rustc").is_none(), "Rust is on the system PATH");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).expect("mkdir home");
    let user_cmd = |program: &str| {
        let mut cmd = bare(program, Some(&user_bin), &home);
        cmd.current_dir(&home);
        cmd
    };
    let mut install = user_cmd("pip");
    install
        .args(["install", "--disable-pip-version-check", "--no-index", "--find-links"])
        .arg(&house)
        .arg(&numpy)
        .arg(&wheel);
    run_ok(install, STEP_TIMEOUT, "pip install of the wheel into a fresh venv");
    for tool in ["hccnrun", "hccn-perf", "hccn-trace", "hccn-info"] {
        assert!(user_bin.join(tool).exists(), "pip install put no {tool} on the venv's PATH");
    }
    let mut which = user_cmd("sh");
    which.args(["-c", "command -v cargo rustc || echo none"]);
    assert_eq!(run_ok(which, STEP_TIMEOUT, "command -v cargo").stdout.trim(), "none");

    // The package finds its own library and knows its version.
    let mut probe = user_cmd("python");
    probe.args(["-c", "import hccn, os; print(hccn.__version__, hccn.version(), hccn._raw.library_path, os.path.exists(os.path.join(hccn.get_include(), 'hccn.h')))"]);
    let probe = run_ok(probe, STEP_TIMEOUT, "import hccn").stdout;
    let site_lib = "/site-packages/hccn/lib/libhccn.so.1";
    assert!(
        probe.starts_with(&format!("{version} ")) && probe.contains(site_lib) && probe.trim_end().ends_with("True"),
        "{probe}"
    );
    assert!(probe.contains(&user.display().to_string()), "not the venv's own library: {probe}");

    // The package's tests, on 2 ranks under the wheel's hccnrun (spelt as MPI users do).
    let mut run = user_cmd("hccnrun");
    run.args(["-np", "2", "python"]).arg(root().join("bindings/python/tests/collectives.py"));
    let out = launch::run(run, RUN_TIMEOUT);
    expect_ok(&out, "collectives.py under the wheel's hccnrun");
    for r in 0..2 {
        let want = format!("[{r}] rank {r} of 2: ok (library {}", user.display());
        assert!(out.stdout.contains(&want) && out.stdout.contains(site_lib), "no {want:?}: {}", out.describe());
    }
    let mut stores = user_cmd("python");
    stores.arg(root().join("bindings/python/tests/init_store.py")).arg("2").arg(tmp.path().join("store"));
    let out = launch::run(stores, RUN_TIMEOUT);
    expect_ok(&out, "init_store.py (a file store, no launcher)");
    assert!(
        out.stdout.contains("file rank 0 of 2: ok") && out.stdout.contains("file rank 1 of 2: ok"),
        "{}",
        out.describe()
    );

    // The tools through their console scripts.
    let mut perf = user_cmd("hccnrun");
    perf.args(["-n", "2", "hccn-perf", "-b", "8", "-e", "64K", "-f", "8", "-c", "-n", "3", "-w", "1"]);
    let out = launch::run(perf, RUN_TIMEOUT);
    expect_ok(&out, "hccn-perf under hccnrun from the wheel");
    assert!(out.stdout.contains("# Wrong elements       : 0 OK") && out.stdout.contains("65536"), "{}", out.describe());
    // A .py program runs with the wheel's own Python (as torchrun runs scripts with its own),
    // not the python3 first on PATH (here the system's: the venv is not on it).
    let script = tmp.path().join("which.py");
    std::fs::write(&script, "import sys; print('PYTHON', sys.executable)\n").expect("write which.py");
    let mut py = bare(user_bin.join("hccnrun"), None, &home);
    py.current_dir(&home).args(["--nproc-per-node", "2"]).arg(&script);
    let out = launch::run(py, RUN_TIMEOUT);
    expect_ok(&out, "hccnrun --nproc-per-node 2 which.py from the wheel");
    for r in 0..2 {
        let want = format!("[{r}] PYTHON {}", user.display());
        assert!(out.stdout.contains(&want), "no {want:?}: {}", out.describe());
    }
    // The README's Python lines, as shown (its block is marked covered-by=tests/tests/wheel.rs).
    let one_liner = readme_python_line();
    let mut readme = user_cmd("sh");
    readme.args(["-c", &one_liner]);
    let out = launch::run(readme, RUN_TIMEOUT);
    expect_ok(&out, &one_liner);
    for r in 0..2 {
        assert!(out.stdout.contains(&format!("[{r}] [2. 2. 2. 2.]")), "{one_liner}: {}", out.describe());
    }
    for tool in ["hccn-trace", "hccn-info", "hccnrun"] {
        let mut help = user_cmd(tool);
        help.arg("--help");
        let out = run_ok(help, STEP_TIMEOUT, &format!("{tool} --help"));
        assert!(out.stdout.contains("usage:"), "{tool} --help: {}", out.describe());
    }
}

/// A fresh venv (`python -m venv --without-pip` from the torch venv's interpreter) in which the
/// pinned torch is already installed, as on a torch user's machine: the torch venv's
/// site-packages seen through a .pth file (no download), less its own `hccn`, through a
/// directory of links. Returns the venv's bin directory and its site-packages.
fn venv_with_torch(dir: &Path) -> (PathBuf, PathBuf) {
    let mut cmd = clean(torch::python());
    cmd.args(["-m", "venv", "--without-pip"]).arg(dir.join("venv"));
    run_ok(cmd, STEP_TIMEOUT, "python -m venv");
    let bin = dir.join("venv/bin");
    let mut cmd = clean(bin.join("python"));
    cmd.args(["-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"]);
    let site = PathBuf::from(run_ok(cmd, STEP_TIMEOUT, "site-packages").stdout.trim());
    let mut cmd = clean(torch::python());
    cmd.args(["-c", "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))"]);
    let torch_site = PathBuf::from(run_ok(cmd, STEP_TIMEOUT, "torch's site-packages").stdout.trim());
    let view = dir.join("torch-site");
    std::fs::create_dir_all(&view).expect("mkdir");
    for entry in std::fs::read_dir(&torch_site).expect("torch's site-packages").flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("hccn") {
            std::os::unix::fs::symlink(entry.path(), view.join(&name)).expect("symlink");
        }
    }
    std::fs::write(site.join("pinned_torch.pth"), format!("{}\n", view.display())).expect("write .pth");
    (bin, site)
}

/// The torch user's route: `scripts/release.sh --wheel` with the pinned torch venv's Python
/// makes the one wheel, which carries torch's "hccn" backend for that torch (tagged for that
/// CPython, its `torch` extra pinning the version; auditwheel agrees on the platform but for
/// torch's own libraries). `pip install` of it into a fresh venv that has torch and nothing of
/// the source tree is all it takes: `dist.init_process_group("hccn")` then runs on 2 ranks under
/// torchrun and under the wheel's hccnrun. A torch of another version is refused at import,
/// naming both versions.
#[test]
fn the_released_wheel_gives_torch_its_hccn_backend_on_two_ranks() {
    let tmp = TempDir::new("wheel-torch");
    let version = workspace_version();
    let torch_version = pin("TORCH_PIN").trim_start_matches("torch==").to_owned();
    let t0 = Instant::now();

    let building = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let dist = tmp.path().join("dist");
    let mut release = clean("bash");
    release
        .arg(root().join("scripts/release.sh"))
        .args(["--wheel", "--out"])
        .arg(&dist)
        .arg("--from")
        .arg(launch::bin_dir())
        .env("PYTHON", torch::python());
    let made = run_ok(release, RELEASE_TIMEOUT, "scripts/release.sh --wheel");
    let aw_bin = venv(&tmp.path().join("auditwheel-venv"));
    let house = wheelhouse(&aw_bin.join("pip"), &aw_bin.join("python"), &[AUDITWHEEL.to_owned()]);
    drop(building);
    eprintln!("release.sh --wheel: {:.0?}: {}", t0.elapsed(), made.stdout.trim());
    assert!(made.stdout.contains(&format!("torch backend for torch {torch_version}")), "{}", made.describe());

    let wheel = only_wheel(&dist);
    let name = wheel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tag = name.strip_prefix(&format!("hccn-{version}-")).and_then(|t| t.strip_suffix(".whl")).unwrap_or_default();
    let (python_tag, platform) = tag.rsplit_once('-').unwrap_or_default();
    assert!(
        python_tag.starts_with("cp3") && platform.starts_with("manylinux_2_"),
        "{name} is not hccn-{version}-cp3X-cp3X-manylinux_2_N_ARCH.whl"
    );
    let audit = auditwheel(&aw_bin, &house, &wheel);
    assert_eq!(audit["sym_tag"], platform, "auditwheel: {audit}");
    let external: Vec<&String> = audit["external_libs"].as_object().map(|m| m.keys().collect()).unwrap_or_default();
    assert!(external.iter().all(|l| TORCH_LIBS.contains(&l.as_str())), "needs more than torch's libraries: {audit}");
    let contents = wheel_contents(&aw_bin.join("python"), &wheel);
    assert!(contents.lines().any(|l| l.starts_with("hccn/_torch_C.cpython-3")), "no torch backend: {contents}");
    let mut metadata = clean(aw_bin.join("python"));
    metadata
        .args(["-c", "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); print(z.read(sys.argv[2]).decode())"])
        .arg(&wheel)
        .arg(format!("hccn-{version}.dist-info/METADATA"));
    let metadata = run_ok(metadata, STEP_TIMEOUT, "the wheel's METADATA").stdout;
    let pinned = format!("Requires-Dist: torch=={torch_version}; extra == \"torch\"");
    assert!(metadata.contains(&pinned), "no {pinned:?} in METADATA: {metadata}");

    // The user's venv: torch is there; pip installs the wheel, nothing else.
    let (bin, site) = venv_with_torch(tmp.path());
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).expect("mkdir home");
    let user_cmd = |program: &str| {
        let mut cmd = bare(program, Some(&bin), &home);
        // Importing torch takes seconds per rank on a loaded machine: the ranks meet far apart.
        cmd.current_dir(&home).env("HCCN_TIMEOUT_MS", "120000");
        cmd
    };
    // As the README says, with the `torch` extra: satisfied by the torch that is there.
    let mut install = user_cmd("python");
    install
        .args(["-m", "pip", "install", "--no-index", "--disable-pip-version-check"])
        .arg(format!("{}[torch]", wheel.display()));
    run_ok(install, STEP_TIMEOUT, "pip install 'WHEEL[torch]' into a venv with torch");

    let script = root().join("bindings/python/tests/wheel_torch.py");
    let venv_dir = tmp.path().join("venv").display().to_string();
    let mut torchrun = user_cmd("python");
    torchrun.args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]).arg(&script);
    let mut hccnrun = user_cmd("hccnrun");
    hccnrun.args(["-n", "2", "python"]).arg(&script);
    for (how, cmd) in [("torchrun", torchrun), ("the wheel's hccnrun", hccnrun)] {
        let t = Instant::now();
        let out = launch::run(cmd, RUN_TIMEOUT);
        eprintln!("2 ranks under {how}: {:.1?}", t.elapsed());
        expect_ok(&out, &format!("wheel_torch.py under {how}"));
        for r in 0..2 {
            let line = out.stdout.lines().find(|l| l.contains(&format!("rank {r} of 2: ok"))).unwrap_or_default();
            assert!(
                line.matches(&format!("{venv_dir}/lib/")).count() == 2 && line.contains("hccn/_torch_C.cpython-3"),
                "under {how}, rank {r} did not run the wheel's package and backend: {}",
                out.describe()
            );
        }
    }

    // Another torch: refused at import with both versions named.
    let pairing = site.join("hccn/_torch_C.json");
    let text = std::fs::read_to_string(&pairing).expect("the installed _torch_C.json");
    let claimed = text.replace(&format!("\"torch\": \"{torch_version}\""), "\"torch\": \"2.14.0\"");
    assert_ne!(claimed, text, "{}: no torch version in {text}", pairing.display());
    std::fs::write(&pairing, claimed).expect("write _torch_C.json");
    let mut other = user_cmd("python");
    other.args(["-c", "import hccn.torch"]);
    let out = launch::run(other, STEP_TIMEOUT);
    assert_ne!(out.code, Some(0), "a backend built for another torch was loaded: {}", out.describe());
    for want in ["built for torch 2.14.0", &format!("this Python has torch {torch_version}"), "torch==2.14.0"] {
        assert!(out.stderr.contains(want), "no {want:?} in the import error: {}", out.describe());
    }
    eprintln!("the whole torch route: {:.0?}", t0.elapsed());
}
