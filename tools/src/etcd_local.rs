//! A private etcd for a job (`hccnrun --etcd-local`) and for tests: one member or a cluster,
//! each member with its own data directory and free loopback ports, all killed (and their
//! directories removed) when dropped. Needs the `etcd` binary (scripts/setup.sh installs it).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Member {
    child: Option<Child>,
    dir: PathBuf,
    /// `127.0.0.1:PORT` for clients.
    endpoint: String,
}

/// One etcd member or a cluster of several.
#[derive(Debug)]
pub struct LocalEtcd {
    members: Vec<Member>,
    /// The first member's client endpoint.
    pub endpoint: String,
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

impl LocalEtcd {
    pub fn start() -> Result<LocalEtcd, String> {
        LocalEtcd::cluster(1)
    }

    /// A cluster of `n` members on loopback, ready (a leader elected) when this returns.
    pub fn cluster(n: usize) -> Result<LocalEtcd, String> {
        let ports = (0..n).map(|_| Ok((free_port()?, free_port()?))).collect::<Result<Vec<(u16, u16)>, String>>()?;
        let initial: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}")).collect();
        let mut server = LocalEtcd { members: Vec::new(), endpoint: String::new() };
        for (i, &(client, peer)) in ports.iter().enumerate() {
            {
                let dir = std::env::temp_dir().join(format!("hccn-etcd-{}-{client}", std::process::id()));
                let _ = std::fs::remove_dir_all(&dir);
                let (c, p) = (format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{peer}"));
                let child = Command::new("etcd")
                    .args(["--name", &format!("m{i}"), "--data-dir"])
                    .arg(&dir)
                    .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
                    .args(["--listen-peer-urls", &p, "--initial-advertise-peer-urls", &p])
                    .args(["--initial-cluster", &initial.join(","), "--initial-cluster-state", "new"])
                    .args(["--log-level", "error"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(|e| format!("cannot start etcd ({e}); scripts/setup.sh installs etcd-server"))?;
                server.members.push(Member { child: Some(child), dir, endpoint: format!("127.0.0.1:{client}") });
            }
        }
        server.endpoint = server.members.first().map(|m| m.endpoint.clone()).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.leader().is_none() {
            if Instant::now() >= deadline {
                return Err(format!("the local etcd ({n} member(s)) elected no leader within 30 s"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(server)
    }

    /// The `HCCN_STORE` value naming every member.
    pub fn url(&self) -> String {
        let eps: Vec<&str> = self.members.iter().map(|m| m.endpoint.as_str()).collect();
        format!("etcd://{}", eps.join(","))
    }

    /// Index of the current leader, from a live member's status (etcd's JSON gateway).
    pub fn leader(&self) -> Option<usize> {
        let ids: Vec<Option<(String, String)>> = self.members.iter().map(|m| status(&m.endpoint)).collect();
        let leader = ids.iter().flatten().map(|(_, l)| l.clone()).next()?;
        ids.iter().position(|s| s.as_ref().is_some_and(|(me, _)| *me == leader))
    }

    /// Kills member `i` (SIGKILL), as a crashed host would be.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// (this member's id, the leader's id) from POST /v3/maintenance/status.
fn status(endpoint: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect(endpoint).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let req = format!(
        "POST /v3/maintenance/status HTTP/1.0\r\nHost: {endpoint}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let field = |name: &str| {
        let at = body.find(&format!("\"{name}\":\""))? + name.len() + 4;
        body[at..].split('"').next().map(str::to_owned)
    };
    Some((field("member_id")?, field("leader")?))
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
            let _ = std::fs::remove_dir_all(&self.members[i].dir);
        }
    }
}
