//! The shared-memory transport between ranks of one host, in real processes: the full matrix
//! with every data link forced onto shared memory (`HCCN_TRANSPORT=shm`, which fails the job if
//! any pair cannot share memory), frames far larger than a ring in every traffic pattern, and
//! `HCCN_TRANSPORT=tcp` turning it off. Failures over shared memory are covered by faults.rs and
//! recovery.rs, which run over it by default.

use std::path::PathBuf;
use std::time::Duration;

use hccn_tests::launch;

const LOG: (&str, &str) = ("HCCN_LOG", "hccn_runtime::transport=info");

/// Asserts that every ordered pair of `n` ranks logged its data link as `transport` (with what
/// follows it on the line, such as ` cma=true`).
fn links_are(out: &launch::Outcome, n: u32, transport: &str) {
    let all = format!("{}{}", out.stdout, out.stderr);
    for r in 0..n {
        for p in (0..n).filter(|p| *p != r) {
            let want = format!("data link rank={r} peer={p} transport={transport}");
            assert!(all.contains(&want), "no {want:?}: {}", out.describe());
        }
    }
}

/// The `HASH` lines of an hccn-cma run whose operation starts with `op`, every rank's in turn,
/// after checking that no rank found a wrong element.
fn cma_hashes(out: &launch::Outcome, n: u32, op: &str, what: &str) -> Vec<String> {
    let mut hashes = Vec::new();
    for r in 0..n {
        assert!(out.stdout.contains(&format!("[{r}] WRONG 0")), "{what}: {}", out.describe());
        let prefix = format!("[{r}] HASH {op}");
        hashes.extend(out.stdout.lines().filter(|l| l.starts_with(&prefix)).map(str::to_owned));
    }
    hashes
}

#[test]
fn the_full_matrix_over_shared_memory_with_2_3_4_ranks() {
    let matrix = PathBuf::from(env!("CARGO_BIN_EXE_hccn-matrix"));
    for n in [2u32, 3, 4] {
        let env = [("HCCN_TRANSPORT", "shm"), ("HCCN_CHUNK_BYTES", "4096"), LOG];
        let out = launch::hccnrun(n, &matrix, &[], &env, Duration::from_secs(300));
        assert_eq!(out.code, Some(0), "{n} ranks: {}", out.describe());
        for r in 0..n {
            assert!(out.stdout.contains(&format!("[{r}] rank {r} of {n}: ")), "{}", out.describe());
        }
        assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
        links_are(&out, n, "\"shm\"");
    }
}

#[test]
fn frames_larger_than_a_ring_stream_through_it_in_every_pattern() {
    // 8 MiB chunks: each frame spans many ring slots (the ring holds 1 MiB), and in allreduce,
    // alltoall and allgather both ranks of a pair send such frames to each other at once.
    // With -R the buffers come from hccn_mem_alloc and peers read them through their mappings.
    for (n, register) in [(2u32, false), (3, false), (3, true)] {
        for op in ["allreduce", "alltoall", "allgather", "reduce_scatter", "broadcast"] {
            let mut args = vec!["--op", op, "-b", "1M", "-e", "16M", "-f", "16", "-c", "-w", "1", "-n", "2"];
            if register {
                args.push("-R");
            }
            let env = [("HCCN_TRANSPORT", "shm"), ("HCCN_CHUNK_BYTES", "8388608")];
            let what = format!("{op} on {n} ranks, register={register}");
            let out = launch::hccnrun(n, &launch::bin("hccn-perf"), &args, &env, Duration::from_secs(120));
            assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
            assert!(out.stdout.contains("Wrong elements       : 0 OK"), "{what}: {}", out.describe());
        }
    }
}

#[test]
fn alltoall_blocks_read_in_place_by_more_ranks_than_cores_arrive_whole() {
    // Pairwise alltoall offers its blocks for a single copy even where ranks share cores (the
    // rings' pipelines do not): 4 and 5 ranks on a 2-core machine, blocks from 64 KiB up, read
    // with process_vm_readv whatever it costs this host (HCCN_CMA=on).
    for n in [4u32, 5] {
        let args = ["--op", "alltoall", "-b", "256K", "-e", "16M", "-f", "4", "-c", "-w", "1", "-n", "2"];
        let out = launch::hccnrun(
            n,
            &launch::bin("hccn-perf"),
            &args,
            &[("HCCN_TRANSPORT", "shm"), ("HCCN_CMA", "on")],
            Duration::from_secs(120),
        );
        assert_eq!(out.code, Some(0), "{n} ranks: {}", out.describe());
        assert!(out.stdout.contains("Wrong elements       : 0 OK"), "{n} ranks: {}", out.describe());
    }
}

#[test]
fn single_copy_reads_mapped_buffers_and_the_rings_give_identical_bits_with_2_3_4_ranks() {
    let worker = PathBuf::from(env!("CARGO_BIN_EXE_hccn-cma"));
    // The cost model's chunks, and chunks of exactly the threshold, where a step's full chunks
    // go by descriptor and its shorter last one through the ring.
    for (n, chunk) in [(2u32, "524288"), (3, "524288"), (4, "524288"), (2, "65536"), (3, "65536")] {
        let mut results = Vec::new();
        // Through the rings; read with process_vm_readv (`on`: whatever a read costs this host);
        // buffers from hccn_mem_alloc, mapped (under `auto`, whatever a read costs).
        for (cma, register) in [("off", false), ("on", false), ("auto", true)] {
            let log = ("HCCN_LOG", "hccn_runtime::transport=info,hccn_runtime::mem=info");
            let env = [("HCCN_CMA", cma), ("HCCN_ALGO", "ring"), ("HCCN_CHUNK_BYTES", chunk), log];
            let what = format!("{n} ranks, HCCN_CMA={cma}, HCCN_CHUNK_BYTES={chunk}, register={register}");
            let args: &[&str] = if register { &["--register"] } else { &[] };
            let out = launch::hccnrun(n, &worker, args, &env, Duration::from_secs(240));
            assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
            links_are(&out, n, &format!("\"shm\" cma={}", cma != "off"));
            let mapped = format!("{}{}", out.stdout, out.stderr).contains("mapped a peer's shareable memory");
            assert_eq!(mapped, register, "{what}: peers map shareable buffers, and only those: {}", out.describe());
            let hashes = cma_hashes(&out, n, "", &what);
            assert_eq!(hashes.len(), 6 * 10 * n as usize, "{what}: {}", out.describe());
            results.push(hashes);
        }
        assert_eq!(results[0], results[1], "{n} ranks, HCCN_CHUNK_BYTES={chunk}: HCCN_CMA=off and on differ");
        assert_eq!(results[1], results[2], "{n} ranks, HCCN_CHUNK_BYTES={chunk}: mapped and read buffers differ");
    }
}

#[test]
fn allgather_blocks_read_from_their_owners_match_the_ring_bit_for_bit_with_3_4_5_ranks() {
    // On one host the cost model takes every block of 64 KiB and more straight from its owner
    // (pairwise.rs): out of place, in place and allgatherv in reverse order, heap buffers read
    // with process_vm_readv (HCCN_CMA=on) or through the rings, and mapped ones; HCCN_ALGO=ring
    // for reference.
    let worker = PathBuf::from(env!("CARGO_BIN_EXE_hccn-cma"));
    for n in [3u32, 4, 5] {
        let mut results = Vec::new();
        for (algo, cma, register) in
            [("ring", "auto", false), ("auto", "on", false), ("auto", "off", false), ("auto", "auto", true)]
        {
            let env = [("HCCN_ALGO", algo), ("HCCN_CMA", cma)];
            let what = format!("{n} ranks, HCCN_ALGO={algo}, HCCN_CMA={cma}, register={register}");
            let args: &[&str] = if register { &["--register"] } else { &[] };
            let out = launch::hccnrun(n, &worker, args, &env, Duration::from_secs(240));
            assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
            let hashes = cma_hashes(&out, n, "op=allgather", &what);
            assert_eq!(hashes.len(), 6 * 3 * n as usize, "{what}: {}", out.describe());
            results.push(hashes);
        }
        assert!(results.windows(2).all(|w| w[0] == w[1]), "{n} ranks: the allgathers differ: {results:?}");
    }
}

#[test]
fn tcp_everywhere_when_asked() {
    let matrix = PathBuf::from(env!("CARGO_BIN_EXE_hccn-matrix"));
    let out = launch::hccnrun(3, &matrix, &["--quick"], &[("HCCN_TRANSPORT", "tcp"), LOG], Duration::from_secs(300));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
    links_are(&out, 3, "\"tcp\"");
}

#[test]
fn no_segment_is_left_in_dev_shm() {
    let before = segments();
    let out =
        launch::hccnrun(3, &launch::bin("hccn-perf"), &["-b", "4", "-e", "4", "-n", "1"], &[], Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let left: Vec<String> = segments().into_iter().filter(|s| !before.contains(s)).collect();
    assert!(left.is_empty(), "segments left behind: {left:?}");
}

/// hccn's segment names in /dev/shm now.
fn segments() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return Vec::new() };
    dir.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("hccn-"))
        .collect()
}

#[test]
fn shared_memory_left_by_a_killed_set_up_is_swept_by_the_next_job() {
    // A process killed between creating a segment (or board) and unlinking it leaves the file:
    // files named as hccn's, of a creator that is gone, older than any set-up in progress.
    let dead = std::process::Command::new("true").spawn().and_then(|mut c| c.wait().map(|_| c.id())).expect("true");
    let old = std::time::SystemTime::now() - Duration::from_secs(600);
    let names = [format!("hccn-00000000deadbeef-{dead}-0-1"), format!("hccn-board-{dead}-00000000deadbeef-0-0000beef")];
    for name in &names {
        let f = std::fs::File::create(format!("/dev/shm/{name}")).expect("a file in /dev/shm");
        f.set_modified(old).expect("mtime");
    }
    let out =
        launch::hccnrun(2, &launch::bin("hccn-perf"), &["-b", "8", "-e", "8", "-n", "2"], &[], Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for name in &names {
        assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists(), "{name} is still in /dev/shm");
    }
    // And the job itself leaves nothing of its own.
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .expect("/dev/shm")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("hccn-") && n.contains("deadbeef"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
