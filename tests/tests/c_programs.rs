//! C programs against the installed C ABI: `tests/c/contract.c` is compiled with gcc (ASan and
//! UBSan on) against `include/hccn.h` and `target/release/libhccn.so`, then run under
//! `target/release/hccnrun` with 3 and 4 ranks; and again built without sanitizers, every rank
//! under valgrind memcheck (scripts/setup-hardening.sh installs valgrind).
//!
//! Needs the release build first: `cargo build --release` (the library and the launcher).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Valgrind memcheck: any error, or memory definitely lost, fails the rank with this code.
const VALGRIND: &[&str] = &[
    "valgrind",
    "-q",
    "--error-exitcode=99",
    "--leak-check=full",
    "--errors-for-leak-kinds=definite",
    "--show-leak-kinds=definite",
];

/// Hard limit for one `hccnrun -n N ./contract` run.
const RUN_TIMEOUT: Duration = Duration::from_secs(240);
/// The program's own watchdog fires first, so that a hang is reported with its place.
const PROGRAM_WATCHDOG_SECS: &str = "200";

fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

fn target_release(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir).join("release"),
        None => root.join("target").join("release"),
    }
}

/// A fresh directory under the system temp dir; removed on success, kept on failure.
fn unique_temp_dir() -> PathBuf {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("hccn-c-contract-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a temp dir for the C programs");
    dir
}

/// Collects everything a pipe gives into a shared buffer.
fn drain<R: Read + Send + 'static>(mut pipe: R, into: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => into.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(&chunk[..n]),
            }
        }
    })
}

fn kill_group(child: &Child, signal: i32) {
    if let Ok(pgid) = i32::try_from(child.id()) {
        // SAFETY: killpg only sends a signal; the group is the one `process_group(0)` made for
        // this child, so it holds hccnrun and the ranks it started.
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

struct RunResult {
    /// `None` when the run was killed at the timeout.
    status: Option<ExitStatus>,
    output: String,
    elapsed: Duration,
}

/// Runs `hccnrun -n ranks program` in its own process group, with a hard timeout.
fn run_under_hccnrun(
    hccnrun: &Path,
    ranks: u32,
    program: &Path,
    dir: &Path,
    release: &Path,
    env: &[(&str, String)],
) -> RunResult {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    run_wrapped(hccnrun, ranks, &[], program, dir, release, &env)
}

/// As [`run_under_hccnrun`], each rank started as `wrapper... program` with `env` added.
fn run_wrapped(
    hccnrun: &Path,
    ranks: u32,
    wrapper: &[&str],
    program: &Path,
    dir: &Path,
    release: &Path,
    env: &[(&str, &str)],
) -> RunResult {
    let start = Instant::now();
    let mut child = Command::new(hccnrun)
        .arg("-n")
        .arg(ranks.to_string())
        .args(wrapper)
        .arg(program)
        .envs(env.iter().copied())
        .current_dir(dir)
        // `cargo test` puts target/debug and target/debug/deps on LD_LIBRARY_PATH, which the
        // linker's RUNPATH does not override: without this the program would load a (possibly
        // stale) debug libhccn.so instead of the release one it was linked against.
        .env("LD_LIBRARY_PATH", release)
        // Every sanitizer check stays on, LeakSanitizer included: the library allocates through
        // the same malloc, so what it leaks is reported too (no false positives seen so far).
        .env("ASAN_OPTIONS", "detect_leaks=1:halt_on_error=1")
        .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
        .env("CONTRACT_TIMEOUT", PROGRAM_WATCHDOG_SECS)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", hccnrun.display()));

    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let mut readers = Vec::new();
    if let Some(p) = child.stdout.take() {
        readers.push(drain(p, Arc::clone(&out)));
    }
    if let Some(p) = child.stderr.take() {
        readers.push(drain(p, Arc::clone(&err)));
    }

    let deadline = start + RUN_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
            Ok(None) | Err(_) => {
                kill_group(&child, libc::SIGTERM);
                thread::sleep(Duration::from_secs(2));
                kill_group(&child, libc::SIGKILL);
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    // Ranks left behind by the launcher would keep the pipes open: end the group, then give the
    // readers a bounded time to see the end of their pipes.
    kill_group(&child, libc::SIGKILL);
    let give_up = Instant::now() + Duration::from_secs(10);
    while readers.iter().any(|r| !r.is_finished()) && Instant::now() < give_up {
        thread::sleep(Duration::from_millis(20));
    }
    for r in readers {
        if r.is_finished() {
            let _ = r.join();
        }
    }
    let text =
        |b: &Arc<Mutex<Vec<u8>>>| String::from_utf8_lossy(&b.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    let output = format!("--- stdout ---\n{}--- stderr ---\n{}", text(&out), text(&err));
    RunResult { status, output, elapsed: start.elapsed() }
}

#[test]
fn c_contract_program() {
    contract(&[]);
}

/// The same program on the HCCL backend, with the emulation library standing in for HCCL and
/// ACL (docs/hccl.md): every call of the contract goes through the backend.
#[test]
fn c_contract_program_on_the_hccl_emulation() {
    let emu = target_release(&workspace_root()).join("libhccl_emu.so");
    assert!(emu.exists(), "{} is missing: run `cargo build --release` first", emu.display());
    let emu = emu.display().to_string();
    contract(&[("HCCN_BACKEND", "hccl".into()), ("HCCN_HCCL_LIB", emu.clone()), ("HCCN_ACL_LIB", emu)]);
}

fn contract(env: &[(&str, String)]) {
    let root = workspace_root();
    let release = target_release(&root);
    let lib = release.join("libhccn.so");
    let hccnrun = release.join("hccnrun");
    let header = root.join("include").join("hccn.h");
    let source = root.join("tests").join("c").join("contract.c");
    for need in [&lib, &hccnrun, &header] {
        assert!(
            need.exists(),
            "{} is missing: run `cargo build --release` in {} first (this test uses the release \
             library, launcher and generated header)",
            need.display(),
            root.display()
        );
    }

    let dir = unique_temp_dir();
    let program = dir.join("contract");
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".to_string());
    let compile = Command::new(&cc)
        .current_dir(&root)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined"])
        .arg(format!("-I{}", root.join("include").display()))
        .arg(&source)
        .arg(format!("-L{}", release.display()))
        .arg("-lhccn")
        .arg(format!("-Wl,-rpath,{}", release.display()))
        .arg("-o")
        .arg(&program)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(
        compile.status.success(),
        "compiling {} failed ({}):\n{}{}",
        source.display(),
        compile.status,
        String::from_utf8_lossy(&compile.stdout),
        String::from_utf8_lossy(&compile.stderr)
    );

    let mut failures = Vec::new();
    for ranks in [3u32, 4] {
        let run = run_under_hccnrun(&hccnrun, ranks, &program, &dir, &release, env);
        let verdict = match run.status {
            None => Some(format!("killed after the {}s timeout", RUN_TIMEOUT.as_secs())),
            Some(s) if !s.success() => Some(format!("exited with {s}")),
            Some(_) if !run.output.contains("contract:") => Some("printed no `contract:` summary".into()),
            Some(_) if run.output.contains("FAIL") => Some("printed FAIL lines".into()),
            Some(_) => None,
        };
        match verdict {
            None => eprintln!(
                "hccnrun -n {ranks} contract: ok in {:.1}s: {}",
                run.elapsed.as_secs_f64(),
                run.output.lines().find(|l| l.contains("contract:")).unwrap_or("")
            ),
            Some(why) => failures.push(format!(
                "=== hccnrun -n {ranks} {}: {why} ({:.1}s)\n{}",
                program.display(),
                run.elapsed.as_secs_f64(),
                run.output
            )),
        }
    }
    if failures.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        panic!("the C contract program failed (binary kept in {}):\n{}", dir.display(), failures.join("\n"));
    }
}

#[test]
fn c_contract_program_under_valgrind() {
    let root = workspace_root();
    let release = target_release(&root);
    let (lib, hccnrun) = (release.join("libhccn.so"), release.join("hccnrun"));
    for need in [&lib, &hccnrun] {
        assert!(need.exists(), "{} is missing: run `cargo build --release` first", need.display());
    }
    let have_valgrind = Command::new("valgrind").arg("--version").output().map(|o| o.status.success());
    assert!(
        have_valgrind.unwrap_or(false),
        "valgrind is missing: scripts/setup-hardening.sh installs it (scripts/test.sh runs it)"
    );
    let dir = unique_temp_dir();
    let program = dir.join("contract-plain");
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".to_string());
    // Valgrind cannot run ASan binaries: a plain build with debug information for its reports.
    let compile = Command::new(&cc)
        .current_dir(&root)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-g", "-O1"])
        .arg(format!("-I{}", root.join("include").display()))
        .arg(root.join("tests").join("c").join("contract.c"))
        .arg(format!("-L{}", release.display()))
        .arg("-lhccn")
        .arg(format!("-Wl,-rpath,{}", release.display()))
        .arg("-o")
        .arg(&program)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(compile.status.success(), "compiling failed:\n{}", String::from_utf8_lossy(&compile.stderr));
    // Valgrind slows every rank down many times: give silence detection room (dead vs slow).
    let env = [("HCCN_HEARTBEAT_MS", "500"), ("HCCN_DEAD_AFTER_MS", "20000")];
    let run = run_wrapped(&hccnrun, 3, VALGRIND, &program, &dir, &release, &env);
    let ok = run.status.is_some_and(|s| s.success())
        && run.output.contains("contract:")
        && !run.output.contains("FAIL")
        && !run.output.contains("==");
    if ok {
        eprintln!("valgrind hccnrun -n 3 contract: clean in {:.1}s", run.elapsed.as_secs_f64());
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        panic!(
            "the C contract program under valgrind failed ({:?}, {:.1}s; binary kept in {}):\n{}",
            run.status,
            run.elapsed.as_secs_f64(),
            dir.display(),
            run.output
        );
    }
}
