//! The etcd store against a real etcd server: store semantics, a whole job rendezvousing through
//! it, and replacement ranks joining through its join queue.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hccn_recovery::EtcdStore;
use hccn_runtime::rendezvous::{runs, EtcdAccess, EtcdCluster, Store};
use hccn_runtime::ErrorKind;
use hccn_tests::etcd::{Certs, EtcdServer};
use hccn_tests::launch;

#[test]
fn set_get_wait_and_concurrent_add() {
    let etcd = EtcdServer::start().expect("etcd");
    let store =
        Arc::new(EtcdStore::connect(std::slice::from_ref(&etcd.endpoint), Duration::from_secs(10)).expect("connect"));
    // A wait is answered by a watch when the key appears.
    let waiter = {
        let store = store.clone();
        std::thread::spawn(move || store.get("test/late", Duration::from_secs(10)))
    };
    std::thread::sleep(Duration::from_millis(200));
    store.set("test/late", b"here").expect("set");
    assert_eq!(waiter.join().expect("join").ok(), Some(b"here".to_vec()));
    assert_eq!(store.get("test/never", Duration::from_millis(200)).err().map(|e| e.kind()), Some(ErrorKind::Timeout));
    // Compare-and-swap increments from several threads lose nothing.
    let adders: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || (0..50).for_each(|_| assert!(store.add("test/counter", 1).expect("add") > 0)))
        })
        .collect();
    adders.into_iter().for_each(|t| t.join().expect("adder"));
    assert_eq!(store.add("test/counter", 0).ok(), Some(200));
    // Create-only records: the first decision for a key wins, later ones see it.
    assert_eq!(store.create("test/epochs/1", b"first").ok(), Some(None));
    assert_eq!(store.create("test/epochs/1", b"second").ok(), Some(Some(b"first".to_vec())));
    // Clean-up removes a whole subtree and nothing beside it.
    store.set("test/join/1/addr", b"a").expect("set");
    store.set("test/join/1/admit", b"b").expect("set");
    store.set("test/join/10/addr", b"c").expect("set");
    store.remove_prefix("test/join/1/").expect("remove");
    assert_eq!(store.get("test/join/1/addr", Duration::ZERO).err().map(|e| e.kind()), Some(ErrorKind::Timeout));
    assert_eq!(store.get("test/join/10/addr", Duration::ZERO).ok(), Some(b"c".to_vec()));
}

#[test]
fn a_member_that_leaves_on_purpose_is_not_reported_gone() {
    let etcd = EtcdServer::start().expect("etcd");
    let connect =
        || EtcdStore::connect(std::slice::from_ref(&etcd.endpoint), Duration::from_secs(10)).expect("connect");
    let (a, b) = (connect(), connect());
    let gone = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = gone.clone();
    let on_gone = Box::new(move |name: &str| seen.lock().expect("lock").push(name.to_owned()));
    let watcher = a.keep_member("m/0/0", b"1", Duration::from_secs(2), "m/0/", on_gone).expect("keep").expect("lease");
    let leaver = b.keep_member("m/0/1", b"1", Duration::from_secs(2), "m/0/", Box::new(|_| {})).expect("keep");
    assert_eq!(a.get("m/0/1", Duration::from_secs(5)).ok(), Some(b"1".to_vec()));
    drop(leaver);
    // The withdrawn key goes at once; its lease's expiry would come only after 2 s.
    std::thread::sleep(Duration::from_millis(3000));
    assert_eq!(a.get("m/0/1", Duration::ZERO).err().map(|e| e.kind()), Some(ErrorKind::Timeout));
    assert!(gone.lock().expect("lock").is_empty(), "a graceful departure was reported: {:?}", gone.lock());
    drop(watcher);
}

#[test]
fn with_heartbeats_off_the_etcd_lease_still_finds_a_frozen_rank() {
    let etcd = EtcdServer::start().expect("etcd");
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
    cmd.args(["--store", &etcd.url(), "-n", "3", "--"]).arg(faults).arg("freeze");
    cmd.env("HCCN_HEARTBEAT_MS", "0").env("HCCN_LEASE_TTL_S", "2");
    let out = launch::run(cmd, Duration::from_secs(120));
    assert_eq!(out.code, Some(137), "the frozen rank is killed at the end: {}", out.describe());
    for r in 0..2 {
        let line = out.stdout.lines().find(|l| l.starts_with(&format!("[{r}] ERROR_AT"))).unwrap_or_default();
        assert!(line.contains("code=100 failed=[2]"), "rank {r}: {}", out.describe());
        assert!(line.contains("membership lease"), "rank {r} learnt it elsewhere: {line}");
        assert!(out.stdout.contains(&format!("[{r}] SHRUNK size=2 epoch=1 result=Ok(())")), "{}", out.describe());
    }
}

#[test]
fn a_job_meets_through_etcd_and_runs_the_matrix() {
    let etcd = EtcdServer::start().expect("etcd");
    let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
    cmd.args(["--store", &etcd.url(), "-n", "4", "--"]).arg(env!("CARGO_BIN_EXE_hccn-matrix")).arg("--quick");
    cmd.env("HCCN_CHUNK_BYTES", "4096");
    let out = launch::run(cmd, Duration::from_secs(300));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for r in 0..4 {
        assert!(out.stdout.contains(&format!("[{r}] rank {r} of 4: ")), "{}", out.describe());
    }
}

#[test]
fn a_replacement_joins_through_the_etcd_join_queue() {
    let etcd = EtcdServer::start().expect("etcd");
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
    cmd.args(["--store", &etcd.url(), "--elastic", "--max-restarts", "1", "-n", "4", "--"]).arg(faults).arg("grow");
    let out = launch::run(cmd, Duration::from_secs(120));
    launch::expect_grown(&out);
}

#[test]
fn losing_the_etcd_leader_stops_neither_training_nor_the_next_rebuild() {
    let mut etcd = EtcdServer::cluster(3).expect("etcd cluster");
    let url = etcd.url();
    let job = std::thread::spawn(move || {
        let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
        let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
        cmd.args(["--store", &url, "--elastic", "--max-restarts", "1", "-n", "4", "--"]).arg(faults).arg("grow");
        cmd.env("TEST_KILL_DELAY_MS", "2500").env("HCCN_TIMEOUT_MS", "20000");
        launch::run(cmd, Duration::from_secs(120))
    });
    // While the ranks train (their collectives never touch etcd), the leader dies; the rank
    // failure at 2.5 s then needs a membership change through the re-elected cluster.
    std::thread::sleep(Duration::from_millis(800));
    let leader = etcd.leader().expect("a leader");
    etcd.kill(leader);
    let out = job.join().expect("job thread");
    eprintln!("killed etcd member {leader}");
    launch::expect_grown(&out);
}

#[test]
fn hccnrun_can_run_a_private_etcd_for_the_job() {
    let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
    cmd.args(["--etcd-local", "-n", "3", "--"]).arg(env!("CARGO_BIN_EXE_hccn-matrix")).arg("--quick");
    cmd.env("HCCN_CHUNK_BYTES", "4096");
    let out = launch::run(cmd, Duration::from_secs(300));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.contains("[2] rank 2 of 3: "), "{}", out.describe());
}

#[test]
fn with_etcd_a_shrink_records_its_decision() {
    let etcd = EtcdServer::start().expect("etcd");
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    let job = format!("shrink-record-{}", std::process::id());
    let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
    cmd.args(["--store", &etcd.url(), "-n", "4", "--"]).arg(faults).args(["shrink", "3"]);
    cmd.env("HCCN_JOB_ID", &job);
    let out = launch::run(cmd, Duration::from_secs(120));
    assert_eq!(out.code, Some(137), "{}", out.describe());
    for r in 0..3 {
        assert!(out.stdout.contains(&format!("[{r}] SHRUNK rank={r} size=3 epoch=1")), "{}", out.describe());
    }
    let store = EtcdStore::connect(std::slice::from_ref(&etcd.endpoint), Duration::from_secs(10)).expect("connect");
    // The first run of a new job id is generation 1; a job that lost a rank keeps its records.
    let world = runs::world_prefix(&runs::job_root(&job), 1, 0);
    let record = store.get(&format!("{world}/epochs/1"), Duration::from_secs(5)).expect("decision recorded");
    assert_eq!(record, 3u32.to_le_bytes().to_vec(), "the decision names rank 3 as failed");
}

/// A store connection with the given TLS files and login; the error's kind and text on failure.
fn connect_with(
    etcd: &EtcdServer,
    ca: Option<PathBuf>,
    client: Option<(PathBuf, PathBuf)>,
    login: Option<(&str, &str)>,
) -> Result<EtcdStore, (ErrorKind, String)> {
    let (cert, key) = client.map_or((None, None), |(c, k)| (Some(c), Some(k)));
    let access = EtcdAccess {
        ca,
        cert,
        key,
        user: login.map(|(u, _)| u.to_owned()),
        password: login.map(|(_, p)| p.to_owned()),
    };
    let cluster = EtcdCluster { endpoints: vec![etcd.endpoint.clone()], access };
    EtcdStore::connect_to(&cluster, Duration::from_secs(10)).map_err(|e| (e.kind(), e.to_string()))
}

/// A refusal is a store error that names the cause, and comes at once (not after the timeout).
fn assert_refused(what: &str, r: Result<EtcdStore, (ErrorKind, String)>, started: Instant, needle: &str) {
    let (kind, msg) = r.err().unwrap_or_else(|| panic!("{what}: accepted"));
    eprintln!("{what}: {msg}");
    assert_eq!(kind, ErrorKind::Store, "{what}: {msg}");
    assert!(msg.contains(needle), "{what}: the message does not name {needle:?}: {msg}");
    assert!(started.elapsed() < Duration::from_secs(5), "{what}: refused only after {:?}: {msg}", started.elapsed());
}

#[test]
fn etcd_over_tls_with_client_certificates() {
    let certs = Certs::make("tls").expect("certificates");
    let etcd = EtcdServer::start_tls(&certs.server()).expect("etcd with TLS");
    let store = connect_with(&etcd, Some(certs.ca()), Some(certs.client()), None).expect("the right certificates");
    store.set("tls/k", b"v").expect("set over TLS");
    assert_eq!(store.get("tls/k", Duration::from_secs(5)).ok(), Some(b"v".to_vec()));
    let t = Instant::now();
    assert_refused("a plain client", connect_with(&etcd, None, None, None), t, "HCCN_ETCD_CA");
    let t = Instant::now();
    assert_refused("no client certificate", connect_with(&etcd, Some(certs.ca()), None, None), t, "HCCN_ETCD_CERT");
    let t = Instant::now();
    let rogue = connect_with(&etcd, Some(certs.ca()), Some(certs.rogue_client()), None);
    assert_refused("a client certificate of another CA", rogue, t, "HCCN_ETCD_CERT");
    let t = Instant::now();
    let wrong_ca = connect_with(&etcd, Some(certs.rogue_ca()), Some(certs.client()), None);
    assert_refused("a CA that did not sign the server", wrong_ca, t, "HCCN_ETCD_CA");
    // A whole job (rendezvous, membership leases, its run's presence, hccnrun's clean-up) over TLS.
    let (cert, key) = certs.client();
    let env = [("HCCN_ETCD_CA", certs.ca()), ("HCCN_ETCD_CERT", cert), ("HCCN_ETCD_KEY", key)];
    let out = rerun_with(&etcd.url(), "tls-job", "once", &env);
    assert_ran(&out, 1, "a job over TLS");
    let out = rerun_with(&etcd.url(), "tls-job", "once", &env[..1]);
    let refused = out.stderr.contains("hccn_init_from_env failed with 105: ") && out.stderr.contains("HCCN_ETCD_CERT");
    assert!(out.code != Some(0) && refused, "no client certificate: HCCN_ERROR_STORE naming it: {}", out.describe());
}

#[test]
fn etcd_with_authentication_takes_a_user_and_password() {
    let etcd = EtcdServer::start().expect("etcd");
    hccn_tests::etcd::enable_auth(&etcd.endpoint, "s3cret").expect("auth enabled");
    let store = connect_with(&etcd, None, None, Some(("root", "s3cret"))).expect("the right password");
    store.set("auth/k", b"v").expect("set as root");
    assert_eq!(store.get("auth/k", Duration::from_secs(5)).ok(), Some(b"v".to_vec()));
    let t = Instant::now();
    assert_refused(
        "a wrong password",
        connect_with(&etcd, None, None, Some(("root", "guess"))),
        t,
        "HCCN_ETCD_USER=root",
    );
    let t = Instant::now();
    assert_refused(
        "an unknown user",
        connect_with(&etcd, None, None, Some(("mallory", "x"))),
        t,
        "HCCN_ETCD_USER=mallory",
    );
    let t = Instant::now();
    assert_refused("no login", connect_with(&etcd, None, None, None), t, "HCCN_ETCD_USER");
    let login = [("HCCN_ETCD_USER", PathBuf::from("root")), ("HCCN_ETCD_PASSWORD", PathBuf::from("s3cret"))];
    let out = rerun_with(&etcd.url(), "auth-job", "once", &login);
    assert_ran(&out, 1, "a job as an etcd user");
    let wrong = [("HCCN_ETCD_USER", PathBuf::from("root")), ("HCCN_ETCD_PASSWORD", PathBuf::from("guess"))];
    let out = rerun_with(&etcd.url(), "auth-job", "once", &wrong);
    let refused =
        out.stderr.contains("hccn_init_from_env failed with 105: ") && out.stderr.contains("HCCN_ETCD_USER=root");
    assert!(out.code != Some(0) && refused, "a wrong password: HCCN_ERROR_STORE naming it: {}", out.describe());
    assert!(out.elapsed < Duration::from_secs(20), "a wrong password took {:?} to fail", out.elapsed);
}

/// `hccnrun --store URL -n 3 -- hccn-rerun MODE` as job `job`, with a 60 s rendezvous timeout
/// (a run that waited for it would show in the time taken).
fn rerun(url: &str, job: &str, mode: &str) -> launch::Outcome {
    rerun_with(url, job, mode, &[])
}

/// [`rerun`] with more environment.
fn rerun_with(url: &str, job: &str, mode: &str, env: &[(&str, PathBuf)]) -> launch::Outcome {
    let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
    cmd.args(["--store", url, "-n", "3", "--"]).arg(env!("CARGO_BIN_EXE_hccn-rerun")).arg(mode);
    cmd.env("HCCN_JOB_ID", job).env("HCCN_TIMEOUT_MS", "60000").env("HCCN_LEASE_TTL_S", "2");
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    launch::run(cmd, Duration::from_secs(120))
}

fn job_keys(etcd: &EtcdServer, job: &str) -> u64 {
    hccn_tests::etcd::count_keys(&etcd.endpoint, &format!("{}/", runs::job_root(job))).expect("count keys")
}

/// The job's key count once it reaches zero, or after the lease TTL (2 s) and a margin: a
/// membership key published by a thread of a process that was exiting lives until its lease
/// expires.
fn job_keys_settled(etcd: &EtcdServer, job: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = job_keys(etcd, job);
        if n == 0 || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn assert_ran(out: &launch::Outcome, worlds: usize, what: &str) {
    eprintln!("{what}: exit {:?} after {:?}", out.code, out.elapsed);
    assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
    assert_eq!(out.stdout.matches("] DONE rank=").count(), 3 * worlds, "{what}: {}", out.describe());
    assert!(out.elapsed < Duration::from_secs(30), "{what} took {:?}: {}", out.elapsed, out.describe());
}

#[test]
fn a_job_id_runs_again_after_a_clean_end_and_leaves_no_keys() {
    let etcd = EtcdServer::start().expect("etcd");
    let job = format!("rerun-clean-{}", std::process::id());
    for (run, (mode, worlds)) in [("once", 1), ("once", 1), ("twice", 2)].into_iter().enumerate() {
        let out = rerun(&etcd.url(), &job, mode);
        assert_ran(&out, worlds, &format!("run {run} ({mode})"));
        assert_eq!(job_keys_settled(&etcd, &job), 0, "run {run} ({mode}) left keys in etcd");
    }
    // Without hccnrun: the last rank to leave removes the job's keys.
    let ranks: Vec<_> = (0..3)
        .map(|r| {
            let (url, job) = (etcd.url(), job.clone());
            std::thread::spawn(move || {
                let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hccn-rerun"));
                cmd.arg("once").env("HCCN_RANK", r.to_string()).env("HCCN_WORLD_SIZE", "3");
                cmd.env("HCCN_STORE", url).env("HCCN_JOB_ID", job).env("HCCN_JOB_TOKEN", "rerun-token");
                cmd.env("HCCN_TIMEOUT_MS", "60000");
                launch::run(cmd, Duration::from_secs(90))
            })
        })
        .collect();
    for (r, t) in ranks.into_iter().enumerate() {
        let out = t.join().expect("rank thread");
        assert_eq!(out.code, Some(0), "rank {r} without hccnrun: {}", out.describe());
    }
    assert_eq!(job_keys_settled(&etcd, &job), 0, "the ranks left keys in etcd");
}

#[test]
fn hccnrun_removes_the_keys_of_ranks_that_exit_without_destroying() {
    let etcd = EtcdServer::start().expect("etcd");
    let job = format!("rerun-exit-{}", std::process::id());
    for run in 0..2 {
        let out = rerun(&etcd.url(), &job, "exit");
        assert_ran(&out, 1, &format!("run {run} without destroy"));
        // hccnrun waited for the ranks' leases to expire, then removed every key.
        assert_eq!(job_keys(&etcd, &job), 0, "run {run}: keys left after hccnrun exited");
    }
}

#[test]
fn a_job_id_runs_again_after_the_whole_job_was_killed() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let etcd = EtcdServer::start().expect("etcd");
    let job = format!("rerun-killed-{}", std::process::id());
    let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
    cmd.args(["--store", &etcd.url(), "-n", "3", "--"]).arg(env!("CARGO_BIN_EXE_hccn-rerun")).arg("hold");
    cmd.env("HCCN_JOB_ID", &job).env("HCCN_LEASE_TTL_S", "2").env("HCCN_TIMEOUT_MS", "60000");
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null()).process_group(0);
    let mut held = cmd.spawn().expect("hccnrun");
    let (tx, lines) = std::sync::mpsc::channel();
    let out = held.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ready = 0;
    while ready < 3 && Instant::now() < deadline {
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
            ready += usize::from(line.contains("] READY rank="));
        }
    }
    // The whole job dies at once: hccnrun by SIGKILL, its ranks by their parent-death signal.
    // SAFETY: signalling the process group we created.
    unsafe { libc::killpg(held.id() as i32, libc::SIGKILL) };
    let _ = held.wait();
    assert_eq!(ready, 3, "the first run did not start");
    assert!(job_keys(&etcd, &job) > 0, "the killed run's records are in etcd");
    let out = rerun(&etcd.url(), &job, "once");
    assert_ran(&out, 1, "the run after the killed one");
    assert_eq!(job_keys_settled(&etcd, &job), 0, "the rerun left keys in etcd");
}
