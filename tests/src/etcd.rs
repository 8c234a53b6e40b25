//! A real etcd server for tests: its own data directory, free loopback ports, killed (and its
//! directory removed) when dropped. Needs the `etcd` binary (scripts/setup.sh installs it).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
    /// `127.0.0.1:PORT` for clients.
    pub endpoint: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl EtcdServer {
    pub fn start() -> EtcdServer {
        let (client, peer) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("hccn-etcd-{}-{client}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = format!("http://127.0.0.1:{client}");
        let p = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "hccn-test", "--data-dir"])
            .arg(&dir)
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args(["--listen-peer-urls", &p, "--initial-advertise-peer-urls", &p])
            .args(["--initial-cluster", &format!("hccn-test={p}"), "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd (run scripts/setup.sh to install etcd-server)");
        let server = EtcdServer { child, dir, endpoint: format!("127.0.0.1:{client}") };
        // Ready when the client port accepts connections.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&server.endpoint).is_err() {
            assert!(Instant::now() < deadline, "etcd did not start listening on {}", server.endpoint);
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// The `HCCN_STORE` value for this server.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoint)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
