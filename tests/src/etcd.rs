//! A real etcd for tests: the launcher's private etcd (`hccnrun --etcd-local`), reused, with
//! certificates made by `openssl` for TLS and a root user for etcd's authentication.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

pub use hccn_tools::etcd_local::{EtcdTls, LocalEtcd as EtcdServer};

/// Certificates for one test, in a directory removed on drop: a CA, a server certificate for
/// 127.0.0.1 and a client certificate signed by it, and a second, unrelated CA with a client
/// certificate of its own (which the server must refuse).
#[derive(Debug)]
pub struct Certs {
    pub dir: PathBuf,
}

impl Certs {
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
    pub fn server(&self) -> EtcdTls {
        EtcdTls { cert: self.dir.join("server.pem"), key: self.dir.join("server.key"), client_ca: Some(self.ca()) }
    }
    pub fn client(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("client.pem"), self.dir.join("client.key"))
    }
    pub fn rogue_ca(&self) -> PathBuf {
        self.dir.join("rogue-ca.pem")
    }
    pub fn rogue_client(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("rogue-client.pem"), self.dir.join("rogue-client.key"))
    }

    /// Makes every file with `openssl` (P-256 keys, valid for a day).
    pub fn make(name: &str) -> Result<Certs, String> {
        let dir = std::env::temp_dir().join(format!("hccn-certs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let certs = Certs { dir };
        for ca in ["ca", "rogue-ca"] {
            certs
                .openssl(&["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
                .args(["-keyout", &format!("{ca}.key"), "-out", &format!("{ca}.pem"), "-days", "1"])
                .args(["-subj", &format!("/CN=hccn test {ca}")])
                .status_ok()?;
        }
        certs.issue(
            "server",
            "ca",
            "/CN=etcd",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
        )?;
        certs.issue("client", "ca", "/CN=root", "extendedKeyUsage=clientAuth")?;
        certs.issue("rogue-client", "rogue-ca", "/CN=root", "extendedKeyUsage=clientAuth")?;
        Ok(certs)
    }

    /// A key and a certificate `name` signed by `ca`, with the given extensions.
    fn issue(&self, name: &str, ca: &str, subject: &str, extensions: &str) -> Result<(), String> {
        let ext = self.dir.join(format!("{name}.ext"));
        std::fs::write(&ext, extensions).map_err(|e| e.to_string())?;
        self.openssl(&["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
            .args(["-keyout", &format!("{name}.key"), "-out", &format!("{name}.csr"), "-subj", subject])
            .status_ok()?;
        self.openssl(&["x509", "-req", "-in", &format!("{name}.csr"), "-CA", &format!("{ca}.pem")])
            .args(["-CAkey", &format!("{ca}.key"), "-CAcreateserial", "-out", &format!("{name}.pem"), "-days", "1"])
            .arg("-extfile")
            .arg(&ext)
            .status_ok()
    }

    fn openssl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("openssl");
        cmd.args(args).current_dir(&self.dir).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        cmd
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

trait StatusOk {
    fn status_ok(&mut self) -> Result<(), String>;
}

impl StatusOk for Command {
    fn status_ok(&mut self) -> Result<(), String> {
        let out = self.output().map_err(|e| format!("cannot run openssl ({e}); scripts/setup.sh installs it"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{self:?} failed: {}", String::from_utf8_lossy(&out.stderr)))
        }
    }
}

/// One JSON request to etcd's gRPC gateway (plain HTTP), with a bearer token when given;
/// the reply's body.
fn gateway(endpoint: &str, path: &str, body: &str, token: Option<&str>) -> Result<String, String> {
    let mut s = TcpStream::connect(endpoint).map_err(|e| format!("{endpoint}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    let auth = token.map(|t| format!("Authorization: {t}\r\n")).unwrap_or_default();
    let req = format!(
        "POST {path} HTTP/1.0\r\nHost: {endpoint}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    if !reply.starts_with("HTTP/1.0 200") && !reply.starts_with("HTTP/1.1 200") {
        return Err(format!("{path}: {reply}"));
    }
    Ok(reply.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned())
}

/// Turns on etcd's authentication with a `root` user holding `password` (what
/// `etcdctl user add root && etcdctl auth enable` does), through the gateway.
pub fn enable_auth(endpoint: &str, password: &str) -> Result<(), String> {
    gateway(endpoint, "/v3/auth/user/add", &format!("{{\"name\":\"root\",\"password\":\"{password}\"}}"), None)?;
    // etcd 3.4 makes the root role when it is first granted.
    gateway(endpoint, "/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}", None)?;
    gateway(endpoint, "/v3/auth/enable", "{}", None)?;
    Ok(())
}

/// Number of keys under `/hccn/` + `prefix`, read through the gateway (base64 keys in JSON).
pub fn count_keys(endpoint: &str, prefix: &str) -> Result<u64, String> {
    let key = format!("/hccn/{prefix}");
    let end = prefix_end(key.as_bytes());
    let body =
        format!("{{\"key\":\"{}\",\"range_end\":\"{}\",\"count_only\":true}}", base64(key.as_bytes()), base64(&end));
    let reply = gateway(endpoint, "/v3/kv/range", &body, None)?;
    // `"count":"N"`, absent when zero.
    Ok(reply.split("\"count\":\"").nth(1).and_then(|r| r.split('"').next()).and_then(|n| n.parse().ok()).unwrap_or(0))
}

/// The smallest key above every key with this prefix.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
