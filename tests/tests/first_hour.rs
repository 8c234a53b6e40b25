//! What a new user meets in the first hour, each a surprise once: `hccnrun -np N` (MPI's
//! spelling), `HCCN_LOG` with a value that is no level (refused like every other knob, by the
//! launcher and by the library), and an hccn-perf size range too small for one element per rank
//! (an error that names the smallest size, never an empty table that reads "OK").
//!
//! Needs the release build (`cargo build --release`); takes a few seconds.

use std::process::Command;
use std::time::Duration;

use hccn_tests::launch;
use hccn_tests::scratch::{root, run_ok, TempDir};

const TIMEOUT: Duration = Duration::from_secs(120);

fn hccnrun(args: &[&str], env: &[(&str, &str)]) -> launch::Outcome {
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    launch::run(cmd, TIMEOUT)
}

#[test]
fn hccnrun_takes_np_as_mpirun_does() {
    let perf = launch::bin("hccn-perf").display().to_string();
    let out = hccnrun(&["-np", "2", &perf, "-b", "4K", "-e", "4K", "-c", "-n", "2", "-w", "1"], &[]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(
        out.stdout.contains("nranks: 2") && out.stdout.contains("# Wrong elements       : 0 OK"),
        "{}",
        out.describe()
    );
}

#[test]
fn hccn_perf_says_when_no_size_of_the_range_gives_a_row() {
    let perf = launch::bin("hccn-perf").display().to_string();
    // 10 bytes hold no fp32 per rank of 3: nothing to measure, said so, and a failure.
    let out = hccnrun(&["-n", "3", &perf, "--op", "reduce_scatter", "-b", "10", "-e", "10", "-c"], &[]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("no size in 10 .. 10 bytes holds one fp32 element per rank (3 ranks)"),
        "{}",
        out.describe()
    );
    assert!(out.stderr.contains("(-b 12)"), "names the smallest size that works: {}", out.describe());
    assert!(!out.stdout.contains("OK"), "an empty table must not read as a pass: {}", out.describe());

    // A range whose first sizes are too small: those are named, the others measured.
    let out =
        hccnrun(&["-n", "3", &perf, "--op", "reduce_scatter", "-b", "4", "-e", "16", "-c", "-n", "2", "-w", "1"], &[]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for size in [4, 8] {
        let want = format!("# {size} bytes: skipped, less than one fp32 per rank of 3");
        assert!(out.stdout.contains(&want), "no {want:?}: {}", out.describe());
    }
    assert!(out.stdout.contains("# Wrong elements       : 0 OK"), "{}", out.describe());
}

#[test]
fn an_unknown_hccn_log_value_is_refused_by_the_launcher_and_the_library() {
    let perf = launch::bin("hccn-perf").display().to_string();
    let out = hccnrun(&["-n", "2", &perf], &[("HCCN_LOG", "bogus")]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("hccnrun: HCCN_LOG=\"bogus\"") && out.stderr.contains("is not a level"),
        "{}",
        out.describe()
    );

    // The library, without the launcher: hccn_init_from_env fails with the reason.
    let tmp = TempDir::new("hccn-log");
    let program = tmp.path().join("allreduce");
    let lib = launch::bin_dir();
    let mut cc = Command::new("gcc");
    cc.args(["-std=c99", "-O2", "-I"])
        .arg(root().join("include"))
        .arg(root().join("examples/c/allreduce.c"))
        .arg("-L")
        .arg(&lib)
        .arg("-lhccn")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&program);
    run_ok(cc, TIMEOUT, "gcc examples/c/allreduce.c");
    for value in ["bogus", "verbose", "hccn_runtime"] {
        let mut cmd = Command::new(&program);
        cmd.env("HCCN_LOG", value).env_remove("LD_LIBRARY_PATH");
        cmd.env("HCCN_RANK", "0").env("HCCN_WORLD_SIZE", "1").env("HCCN_STORE", "tcp://127.0.0.1:9");
        let out = launch::run(cmd, TIMEOUT);
        assert_eq!(out.code, Some(1), "HCCN_LOG={value}: {}", out.describe());
        assert!(
            out.stderr.contains("hccn_init_from_env failed: invalid argument"),
            "HCCN_LOG={value}: {}",
            out.describe()
        );
        assert!(out.stderr.contains(&format!("HCCN_LOG={value:?}")), "HCCN_LOG={value}: {}", out.describe());
    }
    // A valid list of levels and targets is taken: a one-rank job runs.
    let out = hccnrun(&["-n", "1", &program.display().to_string()], &[("HCCN_LOG", "warn,hccn_runtime=info")]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
}
