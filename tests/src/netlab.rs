//! Hosts on one machine for network-fault tests: network namespaces joined by a bridge (in a
//! namespace of its own), each host with its own address and host name, an etcd on a host of
//! its own; links cut with nftables drops (no reset: silence, as a pulled cable), slowed with
//! a token bucket (`tc tbf`), both undone at will. Needs root, iproute2 and nftables (CI and the
//! dev machines have them: scripts/setup.sh). Everything is removed when the lab drops.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::launch;

#[derive(Debug)]
pub struct Lab {
    id: String,
    switch: String,
    /// Host namespaces, in rank order (host i runs ranks i*per_host ..).
    pub hosts: Vec<String>,
    /// The namespace of the store host.
    pub store_host: String,
    etcd: Option<Child>,
    etcd_dir: std::path::PathBuf,
}

const NET: &str = "10.77";
const ETCD_PORT: u16 = 23791;

fn run(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn must(args: &[&str]) {
    let st = Command::new(args[0]).args(&args[1..]).output().expect("run a network command (root, iproute2, nftables)");
    assert!(st.status.success(), "{} failed: {}", args.join(" "), String::from_utf8_lossy(&st.stderr));
}

pub fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

impl Lab {
    /// `hosts` rank hosts and a store host, all on one bridge.
    pub fn new(tag: &str, hosts: usize) -> Lab {
        let id = format!("{}{tag}", std::process::id() % 10_000);
        let switch = format!("sw{id}");
        let names: Vec<String> = (0..hosts).map(|i| format!("h{i}x{id}")).collect();
        let store_host = format!("st{id}");
        let lab = Lab {
            id: id.clone(),
            switch: switch.clone(),
            hosts: names.clone(),
            store_host: store_host.clone(),
            etcd: None,
            etcd_dir: std::env::temp_dir().join(format!("hccn-netlab-etcd-{id}")),
        };
        must(&["ip", "netns", "add", &switch]);
        must(&["ip", "-n", &switch, "link", "add", "br0", "type", "bridge"]);
        must(&["ip", "-n", &switch, "link", "set", "br0", "up"]);
        let all: Vec<(String, u32)> =
            names.iter().enumerate().map(|(i, n)| (n.clone(), i as u32 + 1)).chain([(store_host, 100)]).collect();
        for (k, (ns, octet)) in all.iter().enumerate() {
            let (outer, inner) = (format!("b{k}x{id}"), format!("e{k}x{id}"));
            must(&["ip", "netns", "add", ns]);
            must(&["ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner]);
            must(&["ip", "link", "set", &outer, "netns", &switch]);
            must(&["ip", "link", "set", &inner, "netns", ns]);
            must(&["ip", "-n", &switch, "link", "set", &outer, "master", "br0"]);
            must(&["ip", "-n", &switch, "link", "set", &outer, "up"]);
            must(&["ip", "-n", ns, "addr", "add", &format!("{NET}.0.{octet}/24"), "dev", &inner]);
            must(&["ip", "-n", ns, "link", "set", &inner, "up"]);
            must(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        lab
    }

    pub fn addr(&self, host: usize) -> String {
        format!("{NET}.0.{}", host + 1)
    }

    pub fn store_addr(&self) -> String {
        format!("{NET}.0.100")
    }

    /// The device of host `host` (its end of the cable).
    fn dev(&self, host: usize) -> String {
        format!("e{host}x{}", self.id)
    }

    /// Starts etcd on the store host; returns the `HCCN_STORE` value.
    pub fn start_etcd(&mut self) -> String {
        let _ = std::fs::remove_dir_all(&self.etcd_dir);
        let client = format!("http://{}:{ETCD_PORT}", self.store_addr());
        let child = Command::new("ip")
            .args(["netns", "exec", &self.store_host, "etcd", "--name", "m0", "--data-dir"])
            .arg(&self.etcd_dir)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", "http://127.0.0.1:23801", "--initial-advertise-peer-urls"])
            .args(["http://127.0.0.1:23801", "--initial-cluster", "m0=http://127.0.0.1:23801", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd on the store host");
        self.etcd = Some(child);
        format!("etcd://{}:{ETCD_PORT}", self.store_addr())
    }

    /// Drops what host `at` receives from `from` (one direction of a cable).
    fn drop_from(&self, at: &str, from: &str) {
        run(&["ip", "netns", "exec", at, "nft", "add", "table", "inet", "cut"]);
        run(&["ip", "netns", "exec", at, "nft", "add chain inet cut input { type filter hook input priority 0; }"]);
        must(&["ip", "netns", "exec", at, "nft", "add", "rule", "inet", "cut", "input", "ip", "saddr", from, "drop"]);
    }

    /// Cuts the link between hosts `a` and `b` (both ways, silently).
    pub fn cut(&self, a: usize, b: usize) {
        self.drop_from(&self.hosts[a], &self.addr(b));
        self.drop_from(&self.hosts[b], &self.addr(a));
    }

    /// Cuts host `a` off the store host.
    pub fn cut_store(&self, a: usize) {
        self.drop_from(&self.hosts[a], &self.store_addr());
        self.drop_from(&self.store_host, &self.addr(a));
    }

    /// Undoes every cut.
    pub fn heal(&self) {
        for ns in self.hosts.iter().chain([&self.store_host]) {
            run(&["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "cut"]);
        }
    }

    /// Limits what host `host` sends to `rate` (e.g. "4mbit"), queueing up to 400 ms.
    pub fn slow(&self, host: usize, rate: &str) {
        self.slow_queued(host, rate, "32kbit", "400ms");
    }

    /// Limits what host `host` sends to `rate` with a token bucket of `burst` (e.g. "64kb"),
    /// queueing up to `latency` (e.g. "2s": the deep buffers of a congested real network).
    pub fn slow_queued(&self, host: usize, rate: &str, burst: &str, latency: &str) {
        let dev = self.dev(host);
        must(
            &["ip", "netns", "exec", &self.hosts[host], "tc", "qdisc", "replace", "dev", &dev, "root", "tbf"]
                .into_iter()
                .chain(["rate", rate, "burst", burst, "latency", latency])
                .collect::<Vec<_>>(),
        );
    }

    /// Lifts `slow`.
    pub fn unslow(&self, host: usize) {
        let dev = self.dev(host);
        run(&["ip", "netns", "exec", &self.hosts[host], "tc", "qdisc", "del", "dev", &dev, "root"]);
    }

    /// hccnrun on every host at once (`per_host` ranks each, node i on host i, the store at
    /// `store`), each with a hard timeout; `meanwhile` runs on this thread while they do.
    pub fn run(
        &self,
        store: &str,
        per_host: u32,
        program: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
        meanwhile: impl FnOnce(),
    ) -> Vec<launch::Outcome> {
        let nodes = self.hosts.len();
        let threads: Vec<_> = (0..nodes)
            .map(|i| {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", &self.hosts[i], "unshare", "--uts", "sh", "-c"])
                    .arg(format!("hostname host{i} && exec \"$0\" \"$@\""))
                    .arg(launch::bin("hccnrun"))
                    .args(["--nnodes", &nodes.to_string(), "--node-rank", &i.to_string()])
                    .args(["-n", &per_host.to_string(), "--grace", "60", "--store", store, "--"])
                    .arg(program)
                    .args(args)
                    .env("HCCN_JOB_ID", format!("netlab-{}", self.id))
                    .env("HCCN_JOB_TOKEN", "shared-by-every-host")
                    .env("HCCN_BIND_ADDR", self.addr(i));
                cmd.envs(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
                std::thread::spawn(move || launch::run(cmd, Duration::from_secs(120)))
            })
            .collect();
        meanwhile();
        threads.into_iter().map(|t| t.join().expect("a host's hccnrun")).collect()
    }
}

/// Sleeps until `ms` (wall clock) has come.
pub fn sleep_until(ms: u128) {
    let now = now_ms();
    if ms > now {
        std::thread::sleep(Duration::from_millis((ms - now) as u64));
    }
}

/// Waits up to `limit` for `ready`.
pub fn wait_for(limit: Duration, ready: impl Fn() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    ready()
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut c) = self.etcd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.etcd_dir);
        for ns in self.hosts.iter().chain([&self.store_host, &self.switch]) {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}
