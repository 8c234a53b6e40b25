//! What the packaging tests share: temporary directories, commands run as a user's shell would
//! run them, and the repository's root.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::launch::{self, Outcome};

/// The repository's root (canonical, so paths in messages and pkg-config output compare).
pub fn root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// A fresh directory, removed when the test passes (kept for a look when it fails).
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("hccn-{what}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
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
/// program finds libhccn through what it was built or installed with alone.
pub fn clean(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_remove("LD_LIBRARY_PATH");
    cmd
}

/// A command with nothing of the test's environment: only `PATH` (system directories, plus
/// `extra_path` first) and `HOME`; no cargo, no rustc, no HCCN_* variable.
pub fn bare(program: impl AsRef<OsStr>, extra_path: Option<&Path>, home: &Path) -> Command {
    let mut cmd = Command::new(program);
    let system = "/usr/local/bin:/usr/bin:/bin";
    let path = match extra_path {
        Some(p) => format!("{}:{system}", p.display()),
        None => system.to_owned(),
    };
    cmd.env_clear().env("PATH", path).env("HOME", home).env("LANG", "C.UTF-8");
    cmd
}

/// `name` found on the bare PATH, if any.
pub fn on_system_path(name: &str) -> Option<PathBuf> {
    ["/usr/local/bin", "/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(name)).find(|p| p.exists())
}

/// Asserts that `out` exited 0 and returns it.
pub fn must(out: Outcome, what: &str) -> Outcome {
    assert_eq!(out.code, Some(0), "{what} failed: {}", out.describe());
    out
}

/// Runs `cmd` with a hard limit and asserts success.
pub fn run_ok(cmd: Command, timeout: Duration, what: &str) -> Outcome {
    must(launch::run(cmd, timeout), what)
}

/// The workspace version ([workspace.package] in Cargo.toml), which every artifact carries.
pub fn workspace_version() -> String {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let section = text.split("[workspace.package]").nth(1).expect("[workspace.package]");
    section
        .lines()
        .find_map(|l| l.trim().strip_prefix("version").map(|v| v.trim_start_matches([' ', '=']).trim_matches('"')))
        .expect("a version in [workspace.package]")
        .to_owned()
}
