//! A private etcd for a job (`hccnrun --etcd-local`) and for tests: one member or a cluster,
//! each member with its own data directory and free loopback ports, all killed (and their
//! directories removed) when dropped. Needs the `etcd` binary (scripts/setup.sh installs it).
//!
//! Nothing may outlive its owner, even one killed with SIGKILL, which runs no destructor. So each
//! member runs under a small guardian shell in a process group of its own (out of reach of the
//! terminal's signals to the owner's group): the owner holds the guardian's stdin, and when it
//! closes (the owner dropped the member, or died) the guardian kills etcd, waits for it and
//! removes its data directory. etcd itself has PR_SET_PDEATHSIG(SIGKILL) towards the guardian
//! (through `setpriv`), so it dies even if the guardian is killed; a directory left behind then
//! is swept by the next start, as is any `hccn-etcd-<pid>-*` directory whose pid is gone.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Member {
    /// The guardian shell; its pid is the member's process group.
    guardian: Option<Child>,
    /// Its stdin: closing it tells the guardian to stop etcd and clean up.
    lifeline: Option<ChildStdin>,
    /// The last of what etcd wrote to stderr.
    said: Arc<Mutex<Vec<u8>>>,
    dir: PathBuf,
    /// `127.0.0.1:PORT` for clients.
    endpoint: String,
}

/// TLS on the client port of a local etcd: its certificate and key (PEM), and, when `client_ca`
/// is set, the CA whose client certificates it demands (`--client-cert-auth`).
#[derive(Debug, Clone)]
pub struct EtcdTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// One etcd member or a cluster of several.
#[derive(Debug)]
pub struct LocalEtcd {
    members: Vec<Member>,
    /// The first member's client endpoint.
    pub endpoint: String,
    /// Plain-HTTP health port of each member served over TLS (its client port cannot be asked
    /// without a TLS client).
    health: Vec<u16>,
}

/// The guardian: starts etcd (with the parent-death signal when `setpriv` is there), stops it
/// when its own stdin closes, and when etcd has ended, for that reason or its own (a port
/// taken, say), removes the data directory and exits. Positional parameters: the directory,
/// then etcd's command line.
const GUARDIAN: &str = r#"dir=$1; shift
# Background jobs get /dev/null as stdin: the watcher reads the lifeline through fd 3.
exec 3<&0
( command -v setpriv >/dev/null 2>&1 && exec setpriv --pdeathsig KILL -- "$@"; exec "$@" ) 3<&- &
etcd=$!
( read -r _ <&3 || true; kill -KILL "$etcd" 2>/dev/null ) &
# The shell's own notices (a killed job) must not reach a pipe whose reader may be gone.
exec 2>/dev/null
trap '' PIPE
wait "$etcd"
rm -rf "$dir""#;

/// How much of what etcd says on stderr is kept, for the error when it ends at start.
const KEPT_OUTPUT: usize = 4096;

/// Attempts at starting a cluster: a free port found may be taken by someone else before etcd
/// binds it.
const ATTEMPTS: usize = 3;

/// How long a dropped member's guardian gets to clean up before it is killed.
const GUARDIAN_GRACE: Duration = Duration::from_secs(5);

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// The name prefix of the data directories of process `pid`.
fn dir_prefix(pid: u32) -> String {
    format!("hccn-etcd-{pid}-")
}

/// Whether process `pid` exists (a zombie counts as gone).
fn process_exists(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses, which may itself hold any bytes.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Removes the data directories that processes now gone left in `tmp` (a guardian killed with
/// its owner): the owner's pid is in the name.
fn sweep_stale_dirs(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("hccn-etcd-").and_then(|r| r.split('-').next()?.parse::<u32>().ok()) else {
            continue;
        };
        if !process_exists(pid) {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => eprintln!("hccn: removed the data directory {} of a local etcd whose owner is gone", name),
                Err(e) => eprintln!("hccn: cannot remove the stale etcd data directory {name}: {e}"),
            }
        }
    }
}

impl LocalEtcd {
    /// The process group of the first member (its guardian and etcd): signal it to freeze the
    /// store (benches do).
    pub fn process_group(&self) -> Option<i32> {
        self.members.first()?.guardian.as_ref().map(|g| g.id() as i32)
    }

    pub fn start() -> Result<LocalEtcd, String> {
        LocalEtcd::cluster(1)
    }

    /// One member serving clients over TLS (see [`EtcdTls`]).
    pub fn start_tls(tls: &EtcdTls) -> Result<LocalEtcd, String> {
        LocalEtcd::launch(1, Some(tls))
    }

    /// A cluster of `n` members on loopback, ready (a leader elected) when this returns.
    pub fn cluster(n: usize) -> Result<LocalEtcd, String> {
        LocalEtcd::launch(n, None)
    }

    fn launch(n: usize, tls: Option<&EtcdTls>) -> Result<LocalEtcd, String> {
        let tmp = std::env::temp_dir();
        sweep_stale_dirs(&tmp);
        let mut failures = Vec::new();
        for _ in 0..ATTEMPTS {
            match LocalEtcd::try_launch(&tmp, n, tls) {
                Ok(server) => return Ok(server),
                Err(e) => failures.push(e),
            }
        }
        Err(failures.join("; then "))
    }

    fn try_launch(tmp: &Path, n: usize, tls: Option<&EtcdTls>) -> Result<LocalEtcd, String> {
        let ports = (0..n).map(|_| Ok((free_port()?, free_port()?))).collect::<Result<Vec<(u16, u16)>, String>>()?;
        let initial: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}")).collect();
        let mut server = LocalEtcd { members: Vec::new(), endpoint: String::new(), health: Vec::new() };
        for (i, &(client, peer)) in ports.iter().enumerate() {
            let dir = tmp.join(format!("{}{client}", dir_prefix(std::process::id())));
            let endpoint = format!("127.0.0.1:{client}");
            let _ = std::fs::remove_dir_all(&dir);
            let scheme = if tls.is_some() { "https" } else { "http" };
            let (c, p) = (format!("{scheme}://127.0.0.1:{client}"), format!("http://127.0.0.1:{peer}"));
            let mut etcd: Vec<String> = vec!["etcd".into(), "--name".into(), format!("m{i}"), "--data-dir".into()];
            etcd.push(dir.to_string_lossy().into_owned());
            etcd.extend(["--listen-client-urls".into(), c.clone(), "--advertise-client-urls".into(), c]);
            etcd.extend(["--listen-peer-urls".into(), p.clone(), "--initial-advertise-peer-urls".into(), p]);
            etcd.extend([
                "--initial-cluster".into(),
                initial.join(","),
                "--initial-cluster-state".into(),
                "new".into(),
            ]);
            etcd.extend(["--log-level".into(), "error".into()]);
            if let Some(t) = tls {
                etcd.extend(["--cert-file".into(), t.cert.to_string_lossy().into_owned()]);
                etcd.extend(["--key-file".into(), t.key.to_string_lossy().into_owned()]);
                if let Some(ca) = &t.client_ca {
                    etcd.extend(["--client-cert-auth".into(), "--trusted-ca-file".into()]);
                    etcd.push(ca.to_string_lossy().into_owned());
                }
                let health = free_port()?;
                etcd.extend(["--listen-metrics-urls".into(), format!("http://127.0.0.1:{health}")]);
                server.health.push(health);
            }
            server.members.push(spawn_guarded(&dir, &etcd, endpoint)?);
        }
        server.endpoint = server.members.first().map(|m| m.endpoint.clone()).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !server.ready() {
            if let Some(why) = server.ended_member() {
                return Err(why);
            }
            if Instant::now() >= deadline {
                return Err(format!("the local etcd ({n} member(s)) elected no leader within 30 s"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(server)
    }

    /// The first member whose etcd has ended, with what it said.
    fn ended_member(&mut self) -> Option<String> {
        self.members.iter_mut().find_map(|m| {
            let status = m.guardian.as_mut()?.try_wait().ok()??;
            // Its stderr closed with it; give the reader a moment to take the last of it.
            std::thread::sleep(Duration::from_millis(50));
            let said = m.said.lock().map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
            Some(format!("etcd {} ended at start ({status}): {}", m.endpoint, said.trim()))
        })
    }

    fn ready(&self) -> bool {
        if self.health.is_empty() {
            self.leader().is_some()
        } else {
            self.health.iter().all(|&port| healthy(port))
        }
    }

    /// The `HCCN_STORE` value naming every member.
    pub fn url(&self) -> String {
        let eps: Vec<&str> = self.members.iter().map(|m| m.endpoint.as_str()).collect();
        format!("etcd://{}", eps.join(","))
    }

    /// Data directory of member `i` (removed when the member stops).
    pub fn data_dir(&self, i: usize) -> &Path {
        &self.members[i].dir
    }

    /// Index of the current leader, from a live member's status (etcd's JSON gateway; members
    /// without TLS only).
    pub fn leader(&self) -> Option<usize> {
        let ids: Vec<Option<(String, String)>> = self.members.iter().map(|m| status(&m.endpoint)).collect();
        let leader = ids.iter().flatten().map(|(_, l)| l.clone()).next()?;
        ids.iter().position(|s| s.as_ref().is_some_and(|(me, _)| *me == leader))
    }

    /// Kills member `i` (SIGKILL to its process group), as a crashed host would be.
    pub fn kill(&mut self, i: usize) {
        let m = &mut self.members[i];
        m.lifeline = None;
        if let Some(mut g) = m.guardian.take() {
            // SAFETY: a plain syscall; the group is the unreaped guardian's, so still ours.
            unsafe { libc::kill(-(g.id() as libc::pid_t), libc::SIGKILL) };
            let _ = g.wait();
        }
    }

    /// Stops member `i` in order: its guardian stops etcd and removes the data directory.
    fn stop(&mut self, i: usize) {
        let m = &mut self.members[i];
        m.lifeline = None;
        if let Some(mut g) = m.guardian.take() {
            let deadline = Instant::now() + GUARDIAN_GRACE;
            while matches!(g.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if matches!(g.try_wait(), Ok(None)) {
                // SAFETY: as in `kill`.
                unsafe { libc::kill(-(g.id() as libc::pid_t), libc::SIGKILL) };
                let _ = g.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&m.dir);
    }
}

/// Starts `etcd` (its argv) under a guardian in a new process group.
fn spawn_guarded(dir: &Path, etcd: &[String], endpoint: String) -> Result<Member, String> {
    // The shell starts etcd in the background, where a missing binary would go unnoticed.
    if !on_path("etcd") {
        return Err("cannot start etcd (not on PATH); scripts/setup.sh installs etcd-server".into());
    }
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(GUARDIAN).arg("hccn-etcd-guardian").arg(dir).args(etcd);
    cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped()).process_group(0);
    let mut guardian = cmd.spawn().map_err(|e| format!("cannot start etcd's guardian shell: {e}"))?;
    let lifeline = guardian.stdin.take();
    let said = Arc::new(Mutex::new(Vec::new()));
    if let Some(mut stderr) = guardian.stderr.take() {
        // Drained for etcd's whole life (a full pipe would block it); only the tail is kept.
        let kept = said.clone();
        let _ = std::thread::Builder::new().name("etcd-stderr".into()).spawn(move || {
            let mut buf = [0u8; 1024];
            while let Ok(n @ 1..) = stderr.read(&mut buf) {
                if let Ok(mut k) = kept.lock() {
                    k.extend_from_slice(&buf[..n]);
                    let over = k.len().saturating_sub(KEPT_OUTPUT);
                    k.drain(..over);
                }
            }
        });
    }
    Ok(Member { guardian: Some(guardian), lifeline, said, dir: dir.to_path_buf(), endpoint })
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()))
}

/// One HTTP/1.0 exchange with a loopback port; the whole reply.
fn http(endpoint: &str, request: &str) -> Option<String> {
    let mut s = TcpStream::connect(endpoint).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    Some(reply)
}

/// (this member's id, the leader's id) from POST /v3/maintenance/status.
fn status(endpoint: &str) -> Option<(String, String)> {
    let body = http(
        endpoint,
        &format!(
            "POST /v3/maintenance/status HTTP/1.0\r\nHost: {endpoint}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
        ),
    )?;
    let field = |name: &str| {
        let at = body.find(&format!("\"{name}\":\""))? + name.len() + 4;
        body[at..].split('"').next().map(str::to_owned)
    };
    Some((field("member_id")?, field("leader")?))
}

/// Whether the member behind metrics port `port` has a leader (GET /health).
fn healthy(port: u16) -> bool {
    let endpoint = format!("127.0.0.1:{port}");
    http(&endpoint, &format!("GET /health HTTP/1.0\r\nHost: {endpoint}\r\n\r\n"))
        .is_some_and(|r| r.contains("\"health\":\"true\""))
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.stop(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etcd_that_ends_at_start_is_reported_with_what_it_said() {
        let dir = std::env::temp_dir().join(format!("{}1", dir_prefix(std::process::id())));
        let argv: Vec<String> = ["etcd", "--no-such-flag"].iter().map(|s| s.to_string()).collect();
        let member = spawn_guarded(&dir, &argv, "127.0.0.1:1".into()).expect("guardian");
        let mut server = LocalEtcd { members: vec![member], endpoint: String::new(), health: Vec::new() };
        let deadline = Instant::now() + Duration::from_secs(20);
        let why = loop {
            if let Some(why) = server.ended_member() {
                break why;
            }
            assert!(Instant::now() < deadline, "the failed etcd was not noticed");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(why.contains("ended at start") && why.contains("no-such-flag"), "{why}");
    }

    #[test]
    fn the_sweep_removes_only_directories_of_processes_that_are_gone() {
        let tmp = std::env::temp_dir().join(format!("hccn-sweep-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let mut gone = Command::new("true").spawn().expect("spawn true");
        let dead = gone.id();
        gone.wait().expect("reap");
        let stale = tmp.join(format!("{}4242", dir_prefix(dead)));
        let mine = tmp.join(format!("{}4243", dir_prefix(std::process::id())));
        let other = tmp.join("hccn-etcd-notapid");
        for d in [&stale, &mine, &other] {
            std::fs::create_dir_all(d.join("member")).expect("mkdir");
        }
        sweep_stale_dirs(&tmp);
        assert!(!stale.exists(), "the directory of pid {dead}, gone, stays");
        assert!(mine.exists() && other.exists(), "a live owner's directory, or a foreign name, was removed");
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
