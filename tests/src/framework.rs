//! Tests inside a real Python framework (TensorFlow, MindSpore): build the framework's hccn
//! binding once per test binary with its `bindings/<dir>/build.sh`, then run one of its test
//! scripts on 2 ranks under hccnrun, in the framework's pinned venv.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::launch::{self, Outcome};

/// A framework's venv and binding.
#[derive(Debug)]
pub struct Framework {
    /// The venv's interpreter (scripts/setup-frameworks.sh makes it).
    pub python: &'static str,
    /// `bindings/<dir>` holds `build.sh` and `tests/`.
    pub dir: &'static str,
    /// What build.sh needs besides `--lib` and `--out`.
    pub build_args: &'static [&'static str],
    pub build_timeout: Duration,
    /// Extra environment of the ranks.
    pub env: &'static [(&'static str, &'static str)],
}

/// A framework's import alone takes seconds per rank on a loaded 2-core machine.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

fn root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

impl Framework {
    /// Builds the binding once for the test binary; returns the directory for PYTHONPATH.
    pub fn built(&self) -> &'static Path {
        static OUT: OnceLock<PathBuf> = OnceLock::new();
        OUT.get_or_init(|| {
            assert!(
                Path::new(self.python).exists(),
                "{} is missing: run `bash scripts/setup-frameworks.sh all` (scripts/test.sh does)",
                self.python
            );
            // Under target/<profile>/, rebuilt on every run: nothing is left in the temp dir.
            let out = launch::bin_dir().join(format!("bindings-{}", self.dir));
            let mut cmd = Command::new("bash");
            cmd.arg(root().join("bindings").join(self.dir).join("build.sh")).args(self.build_args);
            cmd.arg("--lib").arg(launch::bin_dir()).arg("--out").arg(&out);
            let build = launch::run(cmd, self.build_timeout);
            assert_eq!(build.code, Some(0), "bindings/{}/build.sh failed: {}", self.dir, build.describe());
            out
        })
    }

    /// Runs `bindings/<dir>/tests/<script> args...` on `n` ranks.
    pub fn run_ranks(&self, n: u32, script: &str, args: &[&str]) -> Outcome {
        let mut cmd = Command::new(launch::bin("hccnrun"));
        cmd.args(["-n", &n.to_string(), "--", self.python])
            .arg(root().join("bindings").join(self.dir).join("tests").join(script))
            .args(args)
            .env("PYTHONPATH", self.built())
            // A framework's import and first trace can keep one rank seconds behind the other on
            // a loaded machine: give each wait more room than the default 30 s (the run's own
            // hard timeout still applies).
            .env("HCCN_TIMEOUT_MS", "120000")
            .envs(self.env.iter().copied())
            // The binding finds libhccn.so through its rpath, as a user's would.
            .env_remove("LD_LIBRARY_PATH");
        launch::run(cmd, RUN_TIMEOUT)
    }

    /// Runs `bindings/<dir>/tests/<script>` on 2 ranks.
    pub fn run_two_ranks(&self, script: &str) -> Outcome {
        self.run_ranks(2, script, &[])
    }

    /// Checks that `script` exited 0, that each rank printed `[tag] rank r of 2: ...<ending>`,
    /// and that nothing printed FAIL; returns the run.
    pub fn expect_ranks_ok(&self, script: &str, tag: &str, ending: &str) -> Outcome {
        self.expect_ranks_ok_on(2, script, &[], tag, ending)
    }

    /// [`Self::expect_ranks_ok`] on `n` ranks, with arguments for the script.
    pub fn expect_ranks_ok_on(&self, n: u32, script: &str, args: &[&str], tag: &str, ending: &str) -> Outcome {
        let out = self.run_ranks(n, script, args);
        assert_eq!(out.code, Some(0), "{script} on {n} ranks: {}", out.describe());
        for r in 0..n {
            let line = out.stdout.lines().find(|l| l.contains(&format!("[{tag}] rank {r} of {n}: ")));
            assert!(
                line.is_some_and(|l| l.ends_with(ending)),
                "rank {r} did not end with {ending:?}: {}",
                out.describe()
            );
        }
        assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
        out
    }

    /// [`Self::expect_ranks_ok_on`] for a training script that logs `step N: loss` per step;
    /// prints the per-step log.
    pub fn expect_training_matches(&self, n: u32, script: &str, tag: &str) {
        let out = self.expect_ranks_ok_on(n, script, &[], tag, "ok");
        assert!(out.stdout.contains("step 7: loss"), "no per-step log: {}", out.describe());
        let log: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with("[0]")).collect();
        eprintln!("{n} ranks:\n{}", log.join("\n"));
    }
}
