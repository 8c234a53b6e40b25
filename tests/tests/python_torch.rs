//! torch.distributed on hccn's C++ backend (bindings/python/csrc), in the real interpreter with
//! real torch 2.15 from /opt/hccn/venvs/torch, as real processes under torchrun and hccnrun, each
//! run with a hard timeout: every operation and dtype on 2 to 4 ranks, DDP against Gloo, a lost
//! rank, and the extension built from nothing in a fresh venv.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hccn_tests::launch;
use hccn_tests::torch::{self, expect_ok};

const TIMEOUT: Duration = Duration::from_secs(300);

fn script(name: &str) -> PathBuf {
    torch::root().join("bindings/python/tests").join(name)
}

#[test]
fn every_operation_and_dtype_on_2_ranks_under_torchrun() {
    let out = torch::torchrun(2, &script("torch_backend.py"), &[], TIMEOUT);
    expect_ok(&out, 2, "torch_backend.py on 2 ranks under torchrun");
}

#[test]
fn every_operation_and_dtype_on_3_and_4_ranks_under_hccnrun() {
    for n in [3, 4] {
        let out = torch::hccnrun(n, &[], &script("torch_backend.py"), &[], TIMEOUT);
        expect_ok(&out, n, &format!("torch_backend.py on {n} ranks under hccnrun"));
    }
}

fn ddp(backend: &str, under_hccnrun: bool, dir: &Path) -> PathBuf {
    let file = dir.join(format!("{backend}-{}.f64", if under_hccnrun { "hccnrun" } else { "torchrun" }));
    let f = file.display().to_string();
    let run = || {
        if under_hccnrun {
            torch::hccnrun(2, &[], &script("ddp.py"), &[backend, &f], TIMEOUT)
        } else {
            torch::torchrun(2, &script("ddp.py"), &[backend, &f], TIMEOUT)
        }
    };
    let mut out = run();
    // Torch's own Gloo run is only the reference, and it aborts now and then after its last step
    // ("terminate called without an active exception", SIGABRT, in torch's teardown): seen in a
    // CI rehearsal on 2026-12-04, then on 2026-12-05 at load 5-7 in 1 of 4 runs of ddp.py with
    // hccn not even imported, and twice in a row here. It gets up to three more runs. hccn's
    // runs get none.
    let mut retries = 0;
    while backend == "gloo" && out.code != Some(0) && retries < 3 {
        retries += 1;
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
fn ddp_on_hccn_ends_with_exactly_the_parameters_of_the_same_run_on_gloo() {
    let dir = std::env::temp_dir().join(format!("hccn-py-ddp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let gloo = read_f64(&ddp("gloo", false, &dir));
    assert!(gloo.len() > 600, "{} parameters", gloo.len());
    for under_hccnrun in [false, true] {
        let hccn = read_f64(&ddp("hccn", under_hccnrun, &dir));
        assert_eq!(hccn.len(), gloo.len());
        let diff = gloo.iter().zip(&hccn).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert_eq!(diff, 0.0, "max abs difference from gloo's parameters (hccnrun: {under_hccnrun})");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lost_rank_is_rank_failed_then_the_group_shrinks_and_admits_its_replacement() {
    let out = torch::hccnrun(3, &["--elastic", "--max-restarts", "1"], &script("torch_failure.py"), &[], TIMEOUT);
    assert_eq!(out.code, Some(0), "torch_failure.py: {}", out.describe());
    for line in ["rank 0 of 3: ok", "rank 1 of 3: ok", "replacement rank 2 of 3: ok"] {
        assert!(out.stdout.contains(line), "no {line:?}: {}", out.describe());
    }
}

/// A fresh venv that sees the pinned torch through a .pth file (no download), the package
/// installed into it with pip (which carries the backend when the build sees torch), the
/// extension compiled into it again from nothing (`--force`: the route of a user whose torch
/// the package has no backend for), then a 2-rank run with nothing from the source tree on
/// the path.
#[test]
fn the_extension_builds_in_a_fresh_venv_and_runs_from_the_installed_package() {
    let venv = std::env::temp_dir().join(format!("hccn-torch-venv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&venv);
    let step = |what: &str, mut cmd: Command, timeout: Duration| {
        cmd.env_remove("PYTHONPATH").env_remove("HCCN_LIB");
        let out = launch::run(cmd, timeout);
        assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
        out
    };
    let mut cmd = Command::new(torch::python());
    cmd.args(["-m", "venv", "--without-pip"]).arg(&venv);
    step("python -m venv", cmd, TIMEOUT);
    let py = venv.join("bin/python");
    let mut cmd = Command::new(&py);
    cmd.args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]);
    let site = PathBuf::from(step("site-packages", cmd, TIMEOUT).stdout.trim());
    let torch_site = Command::new(torch::python())
        .args(["-c", "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))"])
        .output()
        .expect("torch's site-packages");
    let torch_site = String::from_utf8_lossy(&torch_site.stdout).trim().to_string();
    std::fs::write(site.join("pinned_torch.pth"), format!("{torch_site}\n")).expect("write .pth");

    let mut cmd = Command::new(&py);
    cmd.args(["-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--disable-pip-version-check"]);
    cmd.arg(torch::root().join("bindings/python"));
    step("pip install bindings/python", cmd, TIMEOUT);
    let mut cmd = Command::new(&py);
    cmd.arg(torch::root().join("bindings/python/build_torch_ext.py")).args(["--install", "--force"]);
    let built = step("build_torch_ext.py --install", cmd, Duration::from_secs(20 * 60));
    eprintln!("fresh venv: {}", built.stdout.trim());
    assert!(built.stdout.contains(&format!("{}/hccn/_torch_C", site.display())), "{}", built.describe());
    assert!(built.stdout.contains("built in"), "not compiled from nothing: {}", built.describe());

    let mut cmd = Command::new(&py);
    cmd.args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]);
    cmd.arg(script("torch_backend.py")).env("PYTHONWARNINGS", "ignore::FutureWarning");
    let out = step("torch_backend.py from the fresh venv", cmd, TIMEOUT);
    expect_ok(&out, 2, "torch_backend.py from the fresh venv");
    let _ = std::fs::remove_dir_all(&venv);
}
