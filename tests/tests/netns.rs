//! Two "hosts" on one machine: network namespaces joined by a veth pair, each with its own host
//! name (UTS namespace) and its own hccnrun; the ranks meet through an etcd running on host A.
//! Needs root and iproute2 (CI and the dev machines have both). Namespaces, etcd and ranks are
//! removed even when a test fails.

use std::process::Command;
use std::time::Duration;

use hccn_tests::launch;

struct Hosts {
    a: String,
    b: String,
    /// The veth end in host A (taking it down cuts the hosts apart).
    va: String,
    etcd: Option<std::process::Child>,
    etcd_dir: std::path::PathBuf,
}

const A_ADDR: &str = "192.168.77.1";
const B_ADDR: &str = "192.168.77.2";
const ETCD_PORT: u16 = 23790;

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip (iproute2)");
    assert!(st.success(), "ip {} failed (root needed)", args.join(" "));
}

impl Hosts {
    fn new(tag: &str) -> Hosts {
        let id = format!("{}{tag}", std::process::id() % 100_000);
        let (a, b) = (format!("hccnA{id}"), format!("hccnB{id}"));
        let (va, vb) = (format!("va{id}"), format!("vb{id}"));
        ip(&["netns", "add", &a]);
        let hosts = Hosts {
            a: a.clone(),
            b: b.clone(),
            va: va.clone(),
            etcd: None,
            etcd_dir: std::env::temp_dir().join(format!("hccn-netns-etcd-{id}")),
        };
        ip(&["netns", "add", &b]);
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        ip(&["link", "set", &va, "netns", &a]);
        ip(&["link", "set", &vb, "netns", &b]);
        ip(&["-n", &a, "addr", "add", &format!("{A_ADDR}/24"), "dev", &va]);
        ip(&["-n", &b, "addr", "add", &format!("{B_ADDR}/24"), "dev", &vb]);
        for (ns, dev) in [(&a, &va), (&b, &vb)] {
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        hosts
    }

    fn start_etcd(&mut self) -> String {
        let _ = std::fs::remove_dir_all(&self.etcd_dir);
        let client = format!("http://{A_ADDR}:{ETCD_PORT}");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.a, "etcd", "--name", "m0", "--data-dir"])
            .arg(&self.etcd_dir)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args([
                "--listen-peer-urls",
                "http://127.0.0.1:23800",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:23800",
            ])
            .args(["--initial-cluster", "m0=http://127.0.0.1:23800", "--log-level", "error"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start etcd in host A");
        self.etcd = Some(child);
        format!("etcd://{A_ADDR}:{ETCD_PORT}")
    }

    /// hccnrun on both hosts at once (node 0 on A, node 1 on B), `per_host` ranks each.
    fn run(
        &self,
        store: &str,
        per_host: u32,
        program: &std::path::Path,
        args: &[&str],
    ) -> (launch::Outcome, launch::Outcome) {
        self.run_with(store, per_host, program, args, &[], || {})
    }

    /// Like `run`, calling `meanwhile` on this thread while the job runs.
    fn run_with(
        &self,
        store: &str,
        per_host: u32,
        program: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
        meanwhile: impl FnOnce(),
    ) -> (launch::Outcome, launch::Outcome) {
        let node = |ns: String, host: &'static str, addr: &'static str, rank: u32| {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &ns, "unshare", "--uts", "sh", "-c"])
                .arg(format!("hostname {host} && exec \"$0\" \"$@\""))
                .arg(launch::bin("hccnrun"))
                .args([
                    "--nnodes",
                    "2",
                    "--node-rank",
                    &rank.to_string(),
                    "-n",
                    &per_host.to_string(),
                    "--store",
                    store,
                    "--",
                ])
                .arg(program)
                .args(args)
                .env("HCCN_JOB_ID", format!("netns-{}", std::process::id()))
                .env("HCCN_JOB_TOKEN", "shared-by-both-hosts")
                .env("HCCN_BIND_ADDR", addr)
                .env("HCCN_CHUNK_BYTES", "4096")
                .env("HCCN_TIMEOUT_MS", "3000");
            cmd.envs(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            std::thread::spawn(move || launch::run(cmd, Duration::from_secs(180)))
        };
        let a = node(self.a.clone(), "host-a", A_ADDR, 0);
        let b = node(self.b.clone(), "host-b", B_ADDR, 1);
        meanwhile();
        (a.join().expect("host A"), b.join().expect("host B"))
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if let Some(mut c) = self.etcd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.etcd_dir);
        // Deleting a namespace removes its end of the veth pair, and with it the other end.
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

#[test]
fn four_ranks_on_two_namespace_hosts_run_the_matrix() {
    let mut hosts = Hosts::new("m");
    let store = hosts.start_etcd();
    let (a, b) = hosts.run(&store, 2, std::path::Path::new(env!("CARGO_BIN_EXE_hccn-matrix")), &["--quick"]);
    assert_eq!((a.code, b.code), (Some(0), Some(0)), "host A: {}\nhost B: {}", a.describe(), b.describe());
    for r in 0..2 {
        assert!(a.stdout.contains(&format!("[{r}] rank {r} of 4: ")), "{}", a.describe());
        assert!(b.stdout.contains(&format!("[{}] rank {} of 4: ", r + 2, r + 2)), "{}", b.describe());
    }
}

#[test]
fn hccn_info_sees_two_hosts() {
    let mut hosts = Hosts::new("i");
    let store = hosts.start_etcd();
    let (a, b) = hosts.run(&store, 2, &launch::bin("hccn-info"), &[]);
    assert_eq!((a.code, b.code), (Some(0), Some(0)), "host A: {}\nhost B: {}", a.describe(), b.describe());
    assert!(a.stdout.contains("4 ranks on 2 host(s)"), "{}", a.describe());
    assert!(a.stdout.contains("host-a") && a.stdout.contains("host-b"), "{}", a.describe());
    assert!(a.stdout.contains("0 <-> 2      tcp"), "a link between the hosts: {}", a.describe());
}

#[test]
fn a_cut_link_is_detected_and_only_the_side_with_the_store_rebuilds() {
    let mut hosts = Hosts::new("p");
    let store = hosts.start_etcd();
    let faults = std::path::Path::new(env!("CARGO_BIN_EXE_hccn-faults"));
    let cut_at = std::sync::Mutex::new(0u128);
    let (a, b) = hosts.run_with(&store, 2, faults, &["partition"], &[], || {
        // Let the four ranks meet and train, then cut the cable: no reset, no EOF, just silence.
        std::thread::sleep(Duration::from_millis(2500));
        *cut_at.lock().expect("lock") =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        ip(&["-n", &hosts.a, "link", "set", &hosts.va, "down"]);
    });
    let cut_at = *cut_at.lock().expect("lock");
    // Each side's first error names ranks of the other side only (one or both: their silence
    // timers run independently), within about HCCN_DEAD_AFTER_MS of the cut.
    for (out, side, others) in [(&a, [0u32, 1], [2u32, 3]), (&b, [2, 3], [0, 1])] {
        for r in side {
            let line = out.stdout.lines().find(|l| l.starts_with(&format!("[{r}] ERROR_AT"))).unwrap_or_default();
            let failed: Vec<u32> = line
                .split("failed=[")
                .nth(1)
                .and_then(|l| l.split(']').next())
                .map(|l| l.split(',').filter_map(|v| v.trim().parse().ok()).collect())
                .unwrap_or_default();
            assert!(line.contains("code=100"), "rank {r}: {line:?}\n{}", out.describe());
            assert!(!failed.is_empty() && failed.iter().all(|f| others.contains(f)), "rank {r}: {line:?}");
            let at: u128 = line.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or(0);
            assert!(
                at >= cut_at && at - cut_at < 3000,
                "rank {r} noticed the cut after {} ms",
                at.saturating_sub(cut_at)
            );
        }
    }
    // Host A holds the store: its ranks agree, record the decision and go on as two.
    for r in [0, 1] {
        assert!(a.stdout.contains(&format!("[{r}] REBUILT size=2 epoch=1 result=Ok(())")), "{}", a.describe());
    }
    // Host B cannot reach the store: no membership change there, and it says so.
    for r in [2, 3] {
        assert!(b.stdout.contains(&format!("[{r}] REBUILD_FAILED")), "{}", b.describe());
    }
}

#[test]
fn hccnrun_starts_a_job_across_hosts_from_a_host_file() {
    let hosts = Hosts::new("f");
    let dir = std::env::temp_dir().join(format!("hccn-hostfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("hosts");
    let text =
        format!("# two hosts, two ranks each\n{} slots=2 addr={A_ADDR}\n{} slots=2 addr={B_ADDR}\n", hosts.a, hosts.b);
    std::fs::write(&file, text).expect("host file");
    // hccnrun itself runs on host A and hosts the embedded store there; every rank is started
    // through the remote command, as ssh would start it on a real machine.
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &hosts.a]).arg(launch::bin("hccnrun"));
    cmd.arg("--hostfile").arg(&file).args(["--remote-cmd", "ip netns exec {host}", "--"]);
    cmd.arg(env!("CARGO_BIN_EXE_hccn-matrix")).arg("--quick");
    cmd.env("HCCN_BIND_ADDR", A_ADDR).env("HCCN_CHUNK_BYTES", "4096").env("HCCN_TIMEOUT_MS", "5000");
    let out = launch::run(cmd, Duration::from_secs(180));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for r in 0..4 {
        assert!(out.stdout.contains(&format!("[{r}] rank {r} of 4: ")), "{}", out.describe());
    }
}

#[test]
fn two_ranks_per_host_allreduce_hierarchically_over_shm_inside_and_tcp_between() {
    let mut hosts = Hosts::new("h");
    let store = hosts.start_etcd();
    let trace = std::env::temp_dir().join(format!("hccn-netns-hier-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&trace);
    let trace_dir = trace.to_string_lossy().into_owned();
    let perf = launch::bin("hccn-perf");
    // Sizes from one element to several chunks per segment, each checked element by element.
    let args = ["-b", "4", "-e", "256K", "-f", "8", "-c", "-w", "1", "-n", "2"];
    // Forced: for the smallest sizes the cost model rightly prefers recursive doubling.
    let log = "hccn_runtime::transport=info,hccn_runtime::comm::linkcost=debug";
    let env = [("HCCN_TRACE", trace_dir.as_str()), ("HCCN_LOG", log), ("HCCN_ALGO", "hier")];
    let (a, b) = hosts.run_with(&store, 2, &perf, &args, &env, || {});
    let files: Vec<String> = std::fs::read_dir(&trace)
        .map(|d| d.filter_map(|e| e.ok()).filter_map(|e| std::fs::read_to_string(e.path()).ok()).collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&trace);
    assert_eq!((a.code, b.code), (Some(0), Some(0)), "host A: {}\nhost B: {}", a.describe(), b.describe());
    assert!(a.stdout.contains("Wrong elements       : 0 OK"), "{}", a.describe());
    // Each rank's data link: shared memory to its neighbour on the same host, TCP across.
    let all = format!("{}{}{}{}", a.stdout, a.stderr, b.stdout, b.stderr);
    for (r, p, t) in
        [(0, 1, "shm"), (1, 0, "shm"), (2, 3, "shm"), (3, 2, "shm"), (0, 2, "tcp"), (1, 3, "tcp"), (3, 0, "tcp")]
    {
        let want = format!("data link rank={r} peer={p} transport=\"{t}\"");
        assert!(all.contains(&want), "no {want:?} in\n{all}");
    }
    // Rank 0 measured shared memory to rank 1 and TCP to host B, and every rank took its figures.
    let agreed: Vec<&str> = all
        .lines()
        .filter(|l| l.contains("link costs agreed"))
        .filter_map(|l| l.split_once("costs=").and_then(|(_, c)| c.split_whitespace().next()))
        .collect();
    assert_eq!(agreed.len(), 4, "one agreement per rank in\n{all}");
    assert!(agreed.iter().all(|c| *c == agreed[0]), "ranks disagree: {agreed:?}");
    assert!(all.contains("source=\"measured\""), "{all}");
    if !all.contains("using the built-in") {
        for builtin in ["shm=1.000us:8.000GB/s", "tcp=50.000us:2.500GB/s"] {
            assert!(!agreed[0].contains(builtin), "not measured: {}", agreed[0]);
        }
    }
    // Every rank traced its allreduces as run by the hierarchical algorithm.
    assert_eq!(files.len(), 4, "one trace per rank in {trace_dir}");
    for f in &files {
        assert!(f.contains("\"op\":\"allreduce\"") && f.contains("\"algorithm\":\"hier\""), "{f}");
        assert!(!f.contains("\"algorithm\":\"ring\""), "an allreduce that was not hierarchical: {f}");
    }
}

#[test]
fn hierarchical_allreduce_is_right_on_uneven_hosts_too() {
    // Groups of 3 of the 4 ranks leave one host with a single rank: the owners of the one
    // segment are that rank and one rank of the other host.
    let mut hosts = Hosts::new("u");
    let store = hosts.start_etcd();
    let (a, b) = hosts.run(&store, 2, std::path::Path::new(env!("CARGO_BIN_EXE_hccn-hier")), &[]);
    assert_eq!((a.code, b.code), (Some(0), Some(0)), "host A: {}\nhost B: {}", a.describe(), b.describe());
    let all = format!("{}{}", a.stdout, b.stdout);
    assert!(all.contains("GROUP [0, 1, 2] hosts=Some([0, 0, 1]) wrong=0"), "{all}");
    assert!(all.contains("GROUP [0, 2, 3] hosts=Some([0, 1, 1]) wrong=0"), "{all}");
    assert!(all.contains("GROUP [0, 1, 2, 3] hosts=Some([0, 0, 1, 1]) wrong=0"), "{all}");
    assert!(!all.contains("FAIL"), "{all}");
}
