//! The HCCL backend (`HCCN_BACKEND=hccl`) through `hccl-emu`, the test double that exports the
//! HCCL and ACL symbols on hccn's native runtime (docs/hccl.md): the collective matrix, a killed
//! rank, shrink, missing or incomplete libraries, the double's own argument checks, and the
//! declared signatures against the public declarations recorded in docs/hccl.md.
//!
//! Needs `cargo build --release` first (libhccl_emu.so, hccnrun, libhccn.so).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hccn_backend_hccl::{Api, SIGNATURES};
use hccn_runtime::{Config, ErrorKind};
use hccn_tests::launch;

fn emu() -> PathBuf {
    let p = launch::bin_dir().join("libhccl_emu.so");
    assert!(p.exists(), "{} is missing: run `cargo build --release` (crate hccn-hccl-emu) first", p.display());
    p
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `hccnrun -n N program args` on the HCCL backend with the emulation library.
fn on_emu(n: u32, program: &Path, args: &[&str], extra: &[(&str, &str)]) -> launch::Outcome {
    let lib = emu();
    let lib = lib.to_str().expect("utf-8 path");
    let mut env = vec![("HCCN_BACKEND", "hccl"), ("HCCN_HCCL_LIB", lib), ("HCCN_ACL_LIB", lib)];
    env.extend_from_slice(extra);
    launch::hccnrun(n, program, args, &env, Duration::from_secs(300))
}

const HCCL_OPS: [&str; 12] = [
    "HcclAllReduce",
    "HcclReduce",
    "HcclReduceScatter",
    "HcclBroadcast",
    "HcclAllGather",
    "HcclAllGatherV",
    "HcclScatter",
    "HcclAlltoAll",
    "HcclAlltoAllV",
    "HcclSend",
    "HcclRecv",
    "HcclBarrier",
];

#[test]
fn the_collective_matrix_runs_through_hccl_on_2_3_4_ranks() {
    let matrix = PathBuf::from(env!("CARGO_BIN_EXE_hccn-matrix"));
    for n in [2u32, 3, 4] {
        let out = on_emu(n, &matrix, &[], &[("HCCN_CHUNK_BYTES", "4096"), ("HCCN_LOG", "info")]);
        assert_eq!(out.code, Some(0), "matrix on {n} ranks: {}", out.describe());
        for r in 0..n {
            assert!(out.stdout.contains(&format!("[{r}] rank {r} of {n}: ")), "rank {r}: {}", out.describe());
        }
        assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(all.contains("HCCL backend loaded"), "the backend was not used: {}", out.describe());
        for op in HCCL_OPS {
            assert!(all.contains(&format!("hccl-emu: first {op}")), "{op} was never called: {}", out.describe());
        }
        // With every optional symbol present nothing HCCL has is staged (tests/tests/
        // hccl_fallbacks.rs runs the same matrix on a library without them).
        assert!(!all.contains("optional symbols absent"), "{}", out.describe());
        for op in ["allgatherv", "scatter", "alltoall"] {
            assert!(!all.contains(&format!("first staged {op}\n")), "{op} was staged: {}", out.describe());
        }
    }
}

#[test]
fn fusion_buckets_and_compressed_allreduce_run_through_hccl() {
    // Buckets pack device tensors with aclrtMalloc and device-to-device copies; the compressed
    // allreduce has no HCCL counterpart and is staged through host memory.
    for (bin, what) in
        [(env!("CARGO_BIN_EXE_hccn-fusion"), "fusion"), (env!("CARGO_BIN_EXE_hccn-compressed"), "compressed")]
    {
        let out = on_emu(3, Path::new(bin), &[], &[("HCCN_CHUNK_BYTES", "4096")]);
        assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
        for r in 0..3 {
            assert!(out.stdout.contains(&format!("[{r}] rank {r} of 3: ")), "{what}: {}", out.describe());
        }
        assert!(!out.stdout.contains("FAIL"), "{what}: {}", out.describe());
    }
}

#[test]
fn operations_run_on_the_callers_own_acl_stream() {
    let program = PathBuf::from(env!("CARGO_BIN_EXE_hccn-hccl-streams"));
    let out = on_emu(3, &program, &[], &[]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for r in 0..3 {
        assert!(out.stdout.contains(&format!("[{r}] STREAMS ok rank {r} of 3")), "{}", out.describe());
    }
}

#[test]
fn a_killed_rank_fails_the_survivors_through_hccl() {
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    // The double makes a task whose peer died hang, as HCCL does until HCCL_EXEC_TIMEOUT: only
    // hccn's own detection and the task abort end the wait.
    let out = on_emu(3, &faults, &["kill"], &[("HCCN_LOG", "info")]);
    assert_eq!(out.code, Some(137), "{}", out.describe());
    assert!(out.stderr.contains("hccl-emu: aclrtDeviceTaskAbort"), "no task abort: {}", out.describe());
    for r in 0..2 {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("[{r}] ERROR_AT")))
            .unwrap_or_else(|| panic!("rank {r} saw no error: {}", out.describe()));
        assert!(line.contains("code=100") && line.contains("failed=[2]"), "rank {r}: {line}");
        assert!(out.stdout.contains(&format!("[{r}] AFTER code=Some(100) async=100")), "{}", out.describe());
    }
}

#[test]
fn a_frozen_rank_is_caught_by_hccns_heartbeats_not_hccls_timeout() {
    // A SIGSTOPped rank: HCCL would wait HCCL_EXEC_TIMEOUT (1836 s); the native side channel's
    // heartbeats name it, the task abort frees the survivors, and they shrink.
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    let out = on_emu(3, &faults, &["freeze"], &[]);
    assert_eq!(out.code, Some(137), "the frozen rank is killed at the end: {}", out.describe());
    for r in 0..2 {
        let err = out.stdout.lines().find(|l| l.starts_with(&format!("[{r}] ERROR_AT"))).unwrap_or_default();
        assert!(err.contains("code=100 failed=[2]"), "rank {r}: {err:?}: {}", out.describe());
        assert!(out.stdout.contains(&format!("[{r}] SHRUNK size=2 epoch=1 result=Ok(())")), "{}", out.describe());
    }
}

#[test]
fn survivors_shrink_to_a_new_hccl_communicator() {
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    // Rank 0 made the world's root info and hosts nothing else: the survivors need a fresh one.
    for (n, victims) in [(4u32, vec![0u32]), (4, vec![0, 2])] {
        let list: Vec<String> = victims.iter().map(|v| v.to_string()).collect();
        let out = on_emu(n, &faults, &["shrink", &list.join(",")], &[("HCCN_TIMEOUT_MS", "20000")]);
        assert_eq!(out.code, Some(137), "{}", out.describe());
        launch::expect_shrunk(&out, n, &victims);
    }
}

#[test]
fn a_replacement_joins_a_rebuilt_hccl_communicator() {
    // hccn_comm_rebuild: the survivors and the replacement build the new HCCL communicator from
    // a root info sent over the rebuilt native side.
    let lib = emu();
    let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
    cmd.args(["--elastic", "--max-restarts", "1", "-n", "4", "--"])
        .arg(env!("CARGO_BIN_EXE_hccn-faults"))
        .arg("grow")
        .env("HCCN_BACKEND", "hccl")
        .env("HCCN_HCCL_LIB", &lib)
        .env("HCCN_ACL_LIB", &lib);
    let out = launch::run(cmd, Duration::from_secs(120));
    launch::expect_grown(&out);
}

#[test]
fn a_missing_library_is_a_clear_error() {
    let cfg =
        Config { hccl_lib: Some(PathBuf::from("/nonexistent/libhccl.so")), acl_lib: Some(emu()), ..Config::default() };
    let e = Api::load(&cfg).expect_err("a missing libhccl.so must not load");
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("/nonexistent/libhccl.so") && e.message().contains("HCCN_HCCL_LIB"), "{e}");

    // The same through the C ABI in a real job: hccn_init_from_env fails with code 7.
    let matrix = PathBuf::from(env!("CARGO_BIN_EXE_hccn-matrix"));
    let out = launch::hccnrun(
        2,
        &matrix,
        &[],
        &[("HCCN_BACKEND", "hccl"), ("HCCN_HCCL_LIB", "/nonexistent/libhccl.so")],
        Duration::from_secs(60),
    );
    assert_ne!(out.code, Some(0), "{}", out.describe());
    assert!(
        out.stderr.contains("failed with 7") && out.stderr.contains("/nonexistent/libhccl.so"),
        "{}",
        out.describe()
    );
}

#[test]
fn a_library_without_the_hccl_symbols_is_named_with_the_symbol() {
    // libhccn.so is a real shared library that exports none of HCCL's functions.
    let wrong = launch::bin_dir().join("libhccn.so");
    assert!(wrong.exists(), "{} is missing: cargo build --release", wrong.display());
    let cfg = Config { hccl_lib: Some(wrong.clone()), acl_lib: Some(emu()), ..Config::default() };
    let e = Api::load(&cfg).expect_err("a library without HCCL symbols must not load");
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("HcclGetRootInfo") && e.message().contains("libhccn.so"), "{e}");
}

#[test]
fn the_emulation_checks_arguments_as_hccl_documents() {
    let lib = emu();
    let cfg = Config { hccl_lib: Some(lib.clone()), acl_lib: Some(lib), ..Config::default() };
    let api = Api::load(&cfg).expect("the emulation loads");
    fn f<T>(o: Option<T>) -> T {
        o.expect("the emulation exports every symbol of the table")
    }
    // SAFETY: every call has its public signature, valid pointers, a single-rank communicator.
    unsafe {
        let init = f(api.aclInit)(std::ptr::null());
        assert!(init == 0 || init == 100002, "aclInit: {init}");
        let mut stream = std::ptr::null_mut();
        assert_ne!(f(api.aclrtCreateStream)(&mut stream), 0, "streams need a device bound on the thread");
        assert_eq!(f(api.aclrtSetDevice)(0), 0);
        assert_eq!(f(api.aclrtCreateStream)(&mut stream), 0);
        let mut root = hccn_backend_hccl::api::HcclRootInfo { internal: [0; 4108] };
        assert_eq!(f(api.HcclGetRootInfo)(&mut root), 0);
        let mut comm = std::ptr::null_mut();
        assert_eq!(f(api.HcclCommInitRootInfo)(1, &root, 0, &mut comm), 0);
        let mut a = [1i64, 2, 3];
        let p = a.as_mut_ptr().cast();
        let all_reduce = f(api.HcclAllReduce);
        // HcclDataType 5 is INT64, which HCCL's AllReduce does not take; 4 (FP32) it does.
        assert_eq!(all_reduce(p, p, 3, 5, 0, comm, stream), 1, "int64 allreduce must be E_PARA");
        assert_eq!(all_reduce(p, p, 3, 4, 4, comm, stream), 1, "reduce op 4 is not HCCL's");
        assert_eq!(all_reduce(p, p, 3, 4, 0, comm, std::ptr::null_mut()), 1, "an operation needs a stream");
        assert_eq!(all_reduce(p, p, 3, 4, 0, std::ptr::null_mut(), stream), 2, "NULL comm is E_PTR");
        assert_eq!(f(api.HcclBroadcast)(p, 3, 5, 1, comm, stream), 1, "root 1 of 1 rank");
        assert_eq!(f(api.HcclAlltoAllV)(p, p, p, 4, p, p, p, 4, comm, stream), 1, "AlltoAllV in place");
        assert_eq!(f(api.HcclBroadcast)(p, 3, 5, 0, comm, stream), 0, "broadcast takes int64");
        assert_eq!(f(api.aclrtSynchronizeStream)(stream), 0);
        assert_eq!(f(api.HcclCommDestroy)(comm), 0);
        assert_eq!(f(api.aclrtDestroyStream)(stream), 0);
    }
}

/// A parsed declaration: return type, name, (type, name) of each argument.
type Decl = (String, String, Vec<(String, String)>);

/// `ret name(type name, ...);` → [`Decl`], with `*` spacing normalised.
fn parse(line: &str) -> Option<Decl> {
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ").replace(" *", "*").replace("* ", "*");
    let open = line.find('(')?;
    let head = &line[..open];
    let name_at = head.rfind(|c: char| !(c.is_alphanumeric() || c == '_'))? + 1;
    let (ret, name) = (norm(&head[..name_at]), head[name_at..].to_owned());
    let args = line[open + 1..].trim_end().strip_suffix(");")?;
    let params = args
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "void")
        .map(|a| {
            let at = a.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
            (norm(&a[..at]), a[at..].to_owned())
        })
        .collect();
    Some((ret, name, params))
}

#[test]
fn declared_signatures_match_the_public_headers() {
    let doc = std::fs::read_to_string(root().join("docs").join("hccl.md")).expect("docs/hccl.md");
    let block = doc
        .split("```c covered-by=tests/tests/hccl.rs\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a ```c block in docs/hccl.md");
    let declared: Vec<_> = block.lines().filter(|l| !l.trim().is_empty()).map(|l| (l, parse(l))).collect();
    let mut problems = Vec::new();
    for (line, p) in &declared {
        if p.is_none() {
            problems.push(format!("cannot parse {line:?}"));
        }
    }
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ").replace(" *", "*").replace("* ", "*");
    for sig in SIGNATURES {
        let Some((ret, _, params)) = declared.iter().filter_map(|(_, p)| p.as_ref()).find(|(_, n, _)| n == sig.name)
        else {
            problems.push(format!("{} is in the symbol table but not among the public declarations", sig.name));
            continue;
        };
        if *ret != norm(sig.ret) {
            problems.push(format!("{}: returns {ret}, the table says {}", sig.name, sig.ret));
        }
        if params.len() != sig.params.len() {
            problems.push(format!(
                "{}: {} arguments declared, {} in the table",
                sig.name,
                params.len(),
                sig.params.len()
            ));
            continue;
        }
        for ((ty, name), (tname, tty)) in params.iter().zip(sig.params) {
            if *ty != norm(tty) || name != tname {
                problems.push(format!("{}: argument {name}: {ty} declared, {tname}: {tty} in the table", sig.name));
            }
        }
    }
    for (_, p) in &declared {
        if let Some((_, name, _)) = p {
            if !SIGNATURES.iter().any(|s| s.name == name) {
                problems.push(format!("{name} is declared in docs/hccl.md but not in the symbol table"));
            }
        }
    }
    // The Rust types behind the C ones are the right size.
    assert_eq!(std::mem::size_of::<hccn_backend_hccl::api::HcclRootInfo>(), 4108);
    assert_eq!(std::mem::size_of::<hccn_backend_hccl::api::HcclCommConfig>(), 24 + 4 + 4 + 128);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_tools_honour_hccn_backend() {
    // hccn-perf on the HCCL backend: device buffers from aclrtMalloc, filled and checked through
    // aclrtMemcpy, the operation through HCCL; -c counts wrong elements.
    let perf = launch::bin_dir().join("hccn-perf");
    for op in ["allreduce", "allgather", "broadcast"] {
        let out = on_emu(
            2,
            &perf,
            &["--op", op, "-b", "64", "-e", "64K", "-f", "32", "-c", "-n", "3", "-w", "1"],
            &[("HCCN_LOG", "info")],
        );
        assert_eq!(out.code, Some(0), "{op}: {}", out.describe());
        assert!(out.stderr.contains("HCCL backend loaded"), "{op}: hccn-perf must run on HCCL: {}", out.describe());
        let rows: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with("[0] ") && !l.contains('#')).collect();
        assert!(rows.len() >= 3, "{op}: too few rows: {}", out.describe());
        for row in rows {
            assert!(row.trim_end().ends_with(" 0"), "{op}: wrong elements on HCCL: {row}");
        }
    }
    // hccn-info reads the control plane of an HCCL communicator.
    let info = launch::bin_dir().join("hccn-info");
    let out = on_emu(2, &info, &[], &[("HCCN_LOG", "info")]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stderr.contains("HCCL backend loaded"), "{}", out.describe());
}
