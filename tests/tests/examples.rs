//! The examples, built and run as a user would: examples/elastic/train.c must end with the loss of
//! a fault-free run although ranks 0 and 2 are killed (-9) during training; the cheap ones (C,
//! C++, Python with numpy) print nothing but their results in a healthy run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hccn_tests::launch;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn build_c(src: &Path, out: &Path) {
    build(Command::new("gcc").arg("-std=c99"), src, out);
}

fn build(compiler: &mut Command, src: &Path, out: &Path) {
    let lib = launch::bin_dir();
    let status = compiler
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root().join("include"))
        .arg(src)
        .arg("-L")
        .arg(&lib)
        .arg("-lhccn")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lm", "-o"])
        .arg(out)
        .status()
        .expect("run gcc");
    assert!(status.success(), "{} does not build", src.display());
}

fn final_loss(out: &launch::Outcome) -> f64 {
    out.stdout
        .lines()
        .find_map(|l| l.split("final loss ").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no final loss: {}", out.describe()))
}

#[test]
fn elastic_training_survives_kill_9_and_matches_a_fault_free_run() {
    let exe = std::env::temp_dir().join(format!("hccn-elastic-train-{}", std::process::id()));
    build_c(&root().join("examples/elastic/train.c"), &exe);
    // cargo test puts target/debug first on the library path; the example links the release build.
    let lib_path = launch::bin_dir().display().to_string();
    let env = [("LD_LIBRARY_PATH", lib_path.as_str())];
    let clean = launch::hccnrun(4, &exe, &["100"], &env, Duration::from_secs(120));
    assert_eq!(clean.code, Some(0), "{}", clean.describe());
    let warned = warnings(&clean);
    assert!(warned.is_empty(), "the fault-free run warned: {warned:#?}\n{}", clean.describe());

    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.args(["--elastic", "-n", "4", "--"]).arg(&exe).arg("100");
    cmd.env("TRAIN_KILL", "0:30,2:60").env("LD_LIBRARY_PATH", &lib_path);
    let faulty = launch::run(cmd, Duration::from_secs(120));
    let _ = std::fs::remove_file(&exe);
    assert_eq!(faulty.code, Some(0), "{}", faulty.describe());
    assert_eq!(faulty.stderr.matches("starting a replacement").count(), 2, "{}", faulty.describe());
    // Launch rank 2 dies right after its step 59 allreduce returned: a survivor still inside
    // that allreduce when the news arrives fails it (any failure ends an operation), so the
    // group resumes from 59 or from 60 (whatever its new rank 0 completed), the same everywhere.
    let resumed: Vec<&str> = faulty
        .stdout
        .lines()
        .filter_map(|l| l.split("training from step ").nth(1))
        .filter(|rest| rest.ends_with("at epoch 2"))
        .collect();
    assert_eq!(resumed.len(), 4, "every rank of epoch 2 resumes: {}", faulty.describe());
    assert!(resumed.iter().all(|r| *r == resumed[0]), "ranks resumed from different steps: {resumed:?}");
    assert!(["59 at epoch 2", "60 at epoch 2"].contains(&resumed[0]), "{}", faulty.describe());
    let (a, b) = (final_loss(&clean), final_loss(&faulty));
    // The same global batches in the same order: only summation order may differ.
    assert!((a - b).abs() <= 1e-7 + 1e-3 * a.abs(), "final loss {b} after failures, {a} without");
    assert!(a < 1e-4, "the model did not train: final loss {a}");
}

/// The lines of a run that a healthy run must not print: the library's warnings, a peer
/// declared failed or a link slow, Python's warnings.
fn warnings(out: &launch::Outcome) -> Vec<&str> {
    let signs = [" WARN ", "peer failed", "slow link", "Warning:", "WARNING"];
    out.stdout.lines().chain(out.stderr.lines()).filter(|l| signs.iter().any(|s| l.contains(s))).collect()
}

/// A script as a user writes it: no `hccn.finalize()`, and the ranks exit at different times
/// (the last a second after the first), so the others are still running as each one exits.
const EXITS_WITHOUT_FINALIZE: &str = "import time, numpy as np, hccn
world = hccn.init()
x = np.ones(1000)
hccn.allreduce(x)
assert x[0] == world.size
time.sleep(world.rank / 2)
print(f'rank {world.rank}: ok', flush=True)
";

#[test]
fn healthy_runs_of_the_examples_print_no_warning() {
    let tmp = hccn_tests::scratch::TempDir::new("quiet-examples");
    let (c, cpp) = (tmp.path().join("allreduce"), tmp.path().join("allreduce-cpp"));
    build_c(&root().join("examples/c/allreduce.c"), &c);
    build(Command::new("g++").arg("-std=c++17"), &root().join("examples/cpp/allreduce.cpp"), &cpp);
    let script = tmp.path().join("exits_without_finalize.py");
    std::fs::write(&script, EXITS_WITHOUT_FINALIZE).expect("write the script");
    let python = Path::new(hccn_tests::torch::PYTHON);
    let numpy_example = root().join("examples/launchers/allreduce.py");
    let mut runs: Vec<(u32, Vec<&Path>)> =
        vec![(2, vec![&c]), (3, vec![&c]), (4, vec![&c]), (2, vec![&cpp]), (4, vec![&cpp])];
    if python.exists() {
        runs.extend([(2, vec![python, &numpy_example]), (4, vec![python, &numpy_example]), (3, vec![python, &script])]);
    } else {
        eprintln!("{} is missing: the Python runs are skipped (scripts/setup-python.sh torch)", python.display());
    }
    for (n, command) in runs {
        let mut cmd = Command::new(launch::bin("hccnrun"));
        cmd.arg("-n").arg(n.to_string()).arg("--").args(command.iter().copied());
        cmd.env("PYTHONPATH", root().join("bindings/python")).env("HCCN_LIB", launch::bin_dir().join("libhccn.so"));
        cmd.env("HCCN_TIMEOUT_MS", "60000");
        let out = launch::run(cmd, Duration::from_secs(120));
        let what = format!("{command:?} on {n} ranks");
        assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
        let ok = out.stdout.lines().filter(|l| l.contains(" ok")).count();
        assert!(ok >= n as usize, "{what}: a rank did not report: {}", out.describe());
        let warned = warnings(&out);
        assert!(warned.is_empty(), "{what} warned in a healthy run: {warned:#?}\n{}", out.describe());
    }
}
