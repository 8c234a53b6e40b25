//! The Python package (bindings/python) and its torch.distributed backend, run in the real
//! interpreter with real torch from /opt/hccn/venvs/torch (made by scripts/setup-python.sh), as
//! real processes under hccnrun and under torchrun, each run with a hard timeout.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hccn_tests::launch::{self, Outcome};

const TIMEOUT: Duration = Duration::from_secs(240);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn script(name: &str) -> PathBuf {
    root().join("bindings/python/tests").join(name)
}

/// The torch virtualenv's interpreter.
fn python() -> PathBuf {
    let p = PathBuf::from("/opt/hccn/venvs/torch/bin/python");
    assert!(p.exists(), "{} is missing: run `bash scripts/setup-python.sh torch`", p.display());
    p
}

/// This build's library, so that a package installed before the last `cargo build` cannot hide
/// a change (the package's own copy is checked by `the_package_finds_its_library`).
fn lib() -> String {
    launch::bin_dir().join("libhccn.so").display().to_string()
}

fn hccnrun(n: u32, args: &[&Path]) -> Outcome {
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.arg("-n").arg(n.to_string()).arg("--").arg(python()).args(args).env("HCCN_LIB", lib());
    launch::run(cmd, TIMEOUT)
}

/// `python -m torch.distributed.run --standalone --nproc-per-node N SCRIPT ARGS` (torchrun).
fn torchrun(n: u32, script: &Path, args: &[&str]) -> Outcome {
    let mut cmd = Command::new(python());
    cmd.args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node"])
        .arg(n.to_string())
        .arg(script)
        .args(args)
        .env("HCCN_LIB", lib());
    launch::run(cmd, TIMEOUT)
}

fn expect_ok(out: &Outcome, n: u32, what: &str) {
    assert_eq!(out.code, Some(0), "{what} failed: {}", out.describe());
    for r in 0..n {
        assert!(
            out.stdout.contains(&format!("rank {r} of {n}: ok")),
            "{what}: rank {r} did not report: {}",
            out.describe()
        );
    }
}

#[test]
fn python_package_collectives_on_numpy_and_torch() {
    // Three ranks: an odd size, a sub-group that leaves a rank out, uneven halves of a split.
    let out = hccnrun(3, &[&script("collectives.py")]);
    expect_ok(&out, 3, "collectives.py");
    assert!(out.stdout.contains(&format!("(library {};", lib())), "HCCN_LIB was not used: {}", out.describe());
    assert!(!out.stdout.contains("numpy only"), "the torch checks were skipped: {}", out.describe());
}

#[test]
fn the_package_finds_its_library_next_to_itself_or_through_hccn_lib() {
    let probe = "import hccn, os; print('LIB', hccn._raw.library_path, hccn.version())";
    let mut cmd = Command::new(python());
    cmd.args(["-c", probe]).env_remove("HCCN_LIB");
    let own = launch::run(cmd, TIMEOUT);
    assert_eq!(own.code, Some(0), "{}", own.describe());
    assert!(own.stdout.contains("/site-packages/hccn/lib/libhccn.so.1 ("), "{}", own.describe());

    let mut cmd = Command::new(python());
    cmd.args(["-c", probe]).env("HCCN_LIB", "/nonexistent/libhccn.so");
    let missing = launch::run(cmd, TIMEOUT);
    assert_ne!(missing.code, Some(0), "{}", missing.describe());
    assert!(
        missing.stderr.contains("ImportError") && missing.stderr.contains("/nonexistent/libhccn.so (missing)"),
        "{}",
        missing.describe()
    );
}

#[test]
fn python_init_through_a_file_store_and_a_torch_tcp_store() {
    let dir = std::env::temp_dir().join(format!("hccn-py-store-{}", std::process::id()));
    let mut cmd = Command::new(python());
    cmd.arg(script("init_store.py")).arg("3").arg(&dir).env("HCCN_LIB", lib());
    let out = launch::run(cmd, TIMEOUT);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(!out.stdout.contains("file store only"), "{}", out.describe());
    for kind in ["file", "tcp"] {
        for r in 0..3 {
            assert!(out.stdout.contains(&format!("{kind} rank {r} of 3: ok")), "{}", out.describe());
        }
    }
}

#[test]
fn torch_backend_every_collective_under_torchrun_and_under_hccnrun() {
    let out = torchrun(2, &script("torch_backend.py"), &[]);
    expect_ok(&out, 2, "torch_backend.py under torchrun");
    let out = hccnrun(3, &[&script("torch_backend.py")]);
    expect_ok(&out, 3, "torch_backend.py under hccnrun");
}

fn ddp(backend: &str, under_hccnrun: bool, dir: &Path) -> PathBuf {
    let file = dir.join(format!("{backend}-{}.f64", if under_hccnrun { "hccnrun" } else { "torchrun" }));
    let f = file.display().to_string();
    let run = || {
        if under_hccnrun {
            hccnrun(2, &[&script("ddp.py"), Path::new(backend), Path::new(&f)])
        } else {
            torchrun(2, &script("ddp.py"), &[backend, &f])
        }
    };
    let mut out = run();
    if backend == "gloo" && out.code != Some(0) {
        // Torch's own Gloo run is only the reference, and it has aborted after its last step
        // ("terminate called without an active exception", SIGABRT, in torch's teardown; seen
        // once, in a CI rehearsal on 2026-12-04): it gets a second run. hccn's runs get none.
        eprintln!("the reference run on gloo failed, running it again: {}", out.describe());
        out = run();
    }
    assert_eq!(out.code, Some(0), "DDP on {backend} failed: {}", out.describe());
    assert!(out.stdout.contains(&format!("{backend} step 7 loss")), "{}", out.describe());
    file
}

/// Raw little-endian float64 values as ddp.py writes them.
fn read_f64(path: &Path) -> Vec<f64> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

#[test]
fn torch_ddp_on_hccn_ends_with_the_parameters_of_the_same_run_on_gloo() {
    let dir = std::env::temp_dir().join(format!("hccn-py-ddp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let gloo = read_f64(&ddp("gloo", false, &dir));
    assert!(gloo.len() > 600, "{} parameters", gloo.len());
    for under_hccnrun in [false, true] {
        let hccn = read_f64(&ddp("hccn", under_hccnrun, &dir));
        assert_eq!(hccn.len(), gloo.len());
        let diff = gloo.iter().zip(&hccn).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(diff <= 1e-6, "max abs difference {diff} from gloo's parameters (hccnrun: {under_hccnrun})");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
