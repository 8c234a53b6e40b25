//! The HCCL backend's fallbacks for optional symbols, through `hccl-emu-minimal`: the same
//! test double as `hccl-emu` (docs/hccl.md) built again exporting only the symbols the backend
//! requires. Each test shows from the logs which path ran: the backend names the absent
//! symbols at load and logs the first staged operation of each kind, and the double logs the
//! first call of each HCCL operation and every communicator creation.
//!
//! Needs `cargo build --release` first (libhccl_emu.so, libhccl_emu_minimal.so, hccnrun).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hccn_backend_hccl::{Api, SIGNATURES};
use hccn_runtime::Config;
use hccn_tests::launch;

fn lib(name: &str) -> PathBuf {
    let p = launch::bin_dir().join(name);
    assert!(p.exists(), "{} is missing: run `cargo build --release` first", p.display());
    p
}

fn minimal() -> PathBuf {
    lib("libhccl_emu_minimal.so")
}

fn optional() -> Vec<&'static str> {
    SIGNATURES.iter().filter(|s| !s.required).map(|s| s.name).collect()
}

/// `hccnrun -n N program args` on the HCCL backend with the minimal library, logging at info.
fn on_minimal(n: u32, program: &Path, args: &[&str], extra: &[(&str, &str)]) -> (launch::Outcome, String) {
    let lib = minimal();
    let lib = lib.to_str().expect("utf-8 path");
    let mut env = vec![("HCCN_BACKEND", "hccl"), ("HCCN_HCCL_LIB", lib), ("HCCN_ACL_LIB", lib), ("HCCN_LOG", "info")];
    env.extend_from_slice(extra);
    let out = launch::hccnrun(n, program, args, &env, Duration::from_secs(120));
    let all = format!("{}{}", out.stdout, out.stderr);
    (out, all)
}

/// The backend ran on the minimal library, knew every optional symbol to be absent, and none of
/// them was called.
fn assert_fallbacks_in_use(all: &str, out: &launch::Outcome) {
    let line = all
        .lines()
        .find(|l| l.contains("optional symbols absent, using their fallbacks:"))
        .unwrap_or_else(|| panic!("the backend did not report absent symbols: {}", out.describe()));
    let listed: Vec<&str> = line.rsplit(':').next().unwrap_or_default().split_whitespace().collect();
    let mut want = optional();
    want.sort_unstable();
    let mut got = listed.clone();
    got.sort_unstable();
    assert_eq!(got, want, "absent symbols: {line}");
    assert!(all.contains("libhccl_emu_minimal.so"), "{}", out.describe());
    for name in ["HcclAllGatherV", "HcclScatter", "HcclAlltoAll"] {
        assert!(!all.contains(&format!("hccl-emu: first {name}\n")), "{name} was called: {}", out.describe());
    }
    for name in ["HcclCommInitRootInfoConfig", "HcclCreateSubCommConfig", "aclrtDeviceTaskAbort"] {
        let name = format!("hccl-emu: {name}");
        assert!(!all.contains(&name), "{name} was called: {}", out.describe());
    }
}

fn exported(path: &Path) -> Vec<String> {
    let out = Command::new("nm").arg("-D").arg("--defined-only").arg(path).output().expect("nm (binutils) runs");
    assert!(out.status.success(), "nm {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .filter(|s| s.starts_with("Hccl") || s.starts_with("acl"))
        .collect()
}

#[test]
fn the_full_double_exports_every_symbol_and_the_minimal_one_only_the_required() {
    // Both are built by one workspace build: a feature unified across it would strip the full one.
    let full = exported(&lib("libhccl_emu.so"));
    let small = exported(&minimal());
    for s in SIGNATURES {
        assert!(full.iter().any(|e| e == s.name), "libhccl_emu.so lacks {}", s.name);
        assert_eq!(small.iter().any(|e| e == s.name), s.required, "libhccl_emu_minimal.so and {}", s.name);
    }
    // The backend sees the same: it loads, with every optional entry empty.
    let path = minimal();
    let api = Api::load(&Config { hccl_lib: Some(path.clone()), acl_lib: Some(path), ..Config::default() })
        .expect("the minimal library has every required symbol");
    let mut absent = api.absent();
    absent.sort_unstable();
    let mut want = optional();
    want.sort_unstable();
    assert_eq!(absent, want);
    // Without HcclGetErrorString / aclGetRecentErrMsg an error carries the number alone.
    let e = api.hccl("HcclAllReduce", 1).expect_err("HCCL_E_PARA is an error");
    assert_eq!(e.kind(), hccn_runtime::ErrorKind::InvalidArgument);
    assert!(e.message().ends_with("failed with HCCL error 1: HcclResult 1"), "{e}");
    let e = api.acl("aclrtMemcpy", 507000).expect_err("an ACL failure is an error");
    assert!(e.message().ends_with("aclrtMemcpy failed with ACL error 507000"), "{e}");
}

#[test]
fn the_collective_matrix_runs_through_the_fallbacks_on_3_and_4_ranks() {
    let matrix = PathBuf::from(env!("CARGO_BIN_EXE_hccn-matrix"));
    for n in [3u32, 4] {
        let (out, all) = on_minimal(n, &matrix, &[], &[("HCCN_CHUNK_BYTES", "4096")]);
        assert_eq!(out.code, Some(0), "matrix on {n} ranks: {}", out.describe());
        for r in 0..n {
            assert!(out.stdout.contains(&format!("[{r}] rank {r} of {n}: ")), "rank {r}: {}", out.describe());
        }
        assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
        assert_fallbacks_in_use(&all, &out);
        // HcclCommInitRootInfo without the config, on every rank.
        for r in 0..n {
            let init = format!("[{r}] ");
            assert!(
                all.lines().any(|l| l.starts_with(&init) && l.contains(&format!("HcclCommInitRootInfo nRanks={n} "))),
                "rank {r} made no HcclCommInitRootInfo communicator: {}",
                out.describe()
            );
        }
        // What HCCL has is still called; what the library lacks is staged.
        for op in ["HcclAllReduce", "HcclReduce", "HcclReduceScatter", "HcclBroadcast", "HcclAllGather"] {
            assert!(all.contains(&format!("hccl-emu: first {op}")), "{op} was never called: {}", out.describe());
        }
        for op in ["HcclAlltoAllV", "HcclSend", "HcclRecv", "HcclBarrier"] {
            assert!(all.contains(&format!("hccl-emu: first {op}")), "{op} was never called: {}", out.describe());
        }
        for op in ["allgatherv", "scatter", "alltoall"] {
            assert!(all.contains(&format!("first staged {op}\n")), "{op} was not staged: {}", out.describe());
        }
    }
}

#[test]
fn groups_splits_staged_operations_and_streams_use_the_fallbacks() {
    let program = PathBuf::from(env!("CARGO_BIN_EXE_hccn-hccl-fallbacks"));
    for n in [3u32, 4] {
        let (out, all) = on_minimal(n, &program, &[], &[]);
        assert_eq!(out.code, Some(0), "{n} ranks: {}", out.describe());
        for r in 0..n {
            assert!(out.stdout.contains(&format!("[{r}] FALLBACKS ok rank {r} of {n}")), "{}", out.describe());
        }
        assert_fallbacks_in_use(&all, &out);
        // Without HcclCreateSubCommConfig every group (the even ranks; each parity of the
        // split) got its HCCL communicator from a fresh root info of its own size.
        let group_inits = all.lines().filter(|l| l.contains("hccl-emu: HcclCommInitRootInfo nRanks=2 ")).count();
        let want = if n == 3 { 2 + 2 } else { 2 + 2 + 2 };
        assert_eq!(group_inits, want, "2-rank HCCL communicators made: {}", out.describe());
        for op in ["allgatherv", "scatter", "alltoall"] {
            assert!(all.contains(&format!("first staged {op}\n")), "{op} was not staged: {}", out.describe());
        }
    }
}

#[test]
fn fusion_buckets_and_the_callers_acl_stream_work_without_the_optional_symbols() {
    // Buckets without aclrtMalloc reduce each tensor on its own; the wrapped stream is waited
    // for without aclrtStreamQuery.
    for (bin, what, ok) in [
        (env!("CARGO_BIN_EXE_hccn-fusion"), "fusion", "rank {r} of 3: "),
        (env!("CARGO_BIN_EXE_hccn-hccl-streams"), "streams", "STREAMS ok rank {r} of 3"),
    ] {
        let (out, all) = on_minimal(3, Path::new(bin), &[], &[("HCCN_CHUNK_BYTES", "4096")]);
        assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
        for r in 0..3 {
            let line = format!("[{r}] {}", ok.replace("{r}", &r.to_string()));
            assert!(out.stdout.contains(&line), "{what}: no {line:?}: {}", out.describe());
        }
        assert!(!out.stdout.contains("FAIL"), "{what}: {}", out.describe());
        assert_fallbacks_in_use(&all, &out);
    }
}

#[test]
fn a_killed_rank_fails_the_survivors_without_task_abort_or_stream_query() {
    // The double keeps the task whose peer died pending, as HCCL does until HCCL_EXEC_TIMEOUT,
    // and nothing can abort it: the survivors must still return RANK_FAILED naming the rank.
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    let (out, all) = on_minimal(3, &faults, &["kill"], &[]);
    assert_eq!(out.code, Some(137), "{}", out.describe());
    assert_fallbacks_in_use(&all, &out);
    for r in 0..2 {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("[{r}] ERROR_AT")))
            .unwrap_or_else(|| panic!("rank {r} saw no error: {}", out.describe()));
        assert!(line.contains("code=100") && line.contains("failed=[2]"), "rank {r}: {line}");
        // Without HcclGetCommAsyncError the native state answers.
        assert!(out.stdout.contains(&format!("[{r}] AFTER code=Some(100) async=100")), "{}", out.describe());
        let torn = format!("[{r}] ");
        assert!(
            all.lines().any(|l| l.starts_with(&torn) && l.contains("HCCL communicator torn down")),
            "rank {r} did not tear its HCCL communicator down: {}",
            out.describe()
        );
    }
}

#[test]
fn survivors_shrink_without_task_abort() {
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    for (n, victims) in [(4u32, vec![0u32]), (4, vec![0, 2])] {
        let list: Vec<String> = victims.iter().map(|v| v.to_string()).collect();
        let (out, all) = on_minimal(n, &faults, &["shrink", &list.join(",")], &[("HCCN_TIMEOUT_MS", "20000")]);
        assert_eq!(out.code, Some(137), "{}", out.describe());
        assert_fallbacks_in_use(&all, &out);
        launch::expect_shrunk(&out, n, &victims);
        let left = n - victims.len() as u32;
        for r in (0..n).filter(|r| !victims.contains(r)) {
            // The shrunk communicator's HCCL side came from a fresh root info (made after the
            // shrink: hccnrun labels it with the new rank).
            let init = format!("[{}] ", launch::rank_after(r, &victims));
            assert!(
                all.lines()
                    .any(|l| l.starts_with(&init) && l.contains(&format!("HcclCommInitRootInfo nRanks={left} "))),
                "rank {r}: no {left}-rank HcclCommInitRootInfo: {}",
                out.describe()
            );
        }
    }
    // A frozen rank: the heartbeats name it, the survivors shrink.
    let (out, all) = on_minimal(3, &faults, &["freeze"], &[]);
    assert_eq!(out.code, Some(137), "{}", out.describe());
    assert_fallbacks_in_use(&all, &out);
    for r in 0..2 {
        assert!(out.stdout.contains(&format!("[{r}] SHRUNK size=2 epoch=1 result=Ok(())")), "{}", out.describe());
    }
}

#[test]
fn revoke_and_rebuild_without_task_abort() {
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    // A revoke tears the HCCL side down (HcclCommDestroy alone here); shrink renews it.
    let (out, all) = on_minimal(3, &faults, &["revoke"], &[]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_fallbacks_in_use(&all, &out);
    for r in 0..3 {
        assert!(out.stdout.contains(&format!("[{r}] AFTER_REVOKE code=Some(101)")), "{}", out.describe());
        assert!(out.stdout.contains(&format!("[{r}] SHRUNK size=3 epoch=1 result=Ok(())")), "{}", out.describe());
    }
    // hccn_comm_rebuild admits a replacement for a killed rank into a new HCCL communicator.
    let lib = minimal();
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.args(["--elastic", "--max-restarts", "1", "-n", "4", "--"])
        .arg(&faults)
        .arg("grow")
        .env("HCCN_BACKEND", "hccl")
        .env("HCCN_HCCL_LIB", &lib)
        .env("HCCN_ACL_LIB", &lib)
        .env("HCCN_LOG", "info");
    let out = launch::run(cmd, Duration::from_secs(120));
    launch::expect_grown(&out);
    let all = format!("{}{}", out.stdout, out.stderr);
    assert_fallbacks_in_use(&all, &out);
    // Every rank (the replacement as the killed rank 3's successor) made a second 4-rank HCCL
    // communicator, from a root info sent over the rebuilt native side.
    for r in 0..4 {
        let me = format!("[{r}] ");
        let made = all
            .lines()
            .filter(|l| l.starts_with(&me) && l.contains("hccl-emu: HcclCommInitRootInfo nRanks=4 "))
            .count();
        assert_eq!(made, 2, "rank {r}: 4-rank HCCL communicators made: {}", out.describe());
    }
}
