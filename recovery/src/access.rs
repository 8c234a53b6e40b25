//! Getting into an etcd cluster: TLS with the CA of `HCCN_ETCD_CA` (and a client certificate
//! from `HCCN_ETCD_CERT` / `HCCN_ETCD_KEY` for `--client-cert-auth`), and etcd's own users
//! (`HCCN_ETCD_USER` / `HCCN_ETCD_PASSWORD`). A refusal (an untrusted or missing certificate, a
//! wrong password) is reported at connection, by name and at once: retrying cannot fix it.

use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client, ConnectOptions, GetOptions, Identity, TlsOptions};
use hccn_runtime::rendezvous::EtcdAccess;
use hccn_runtime::{Error, ErrorKind, Result};

/// A key every hccn user may read (all of hccn's keys are below it).
const PROBE_KEY: &str = "/hccn/";

fn read(name: &str, path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::new(ErrorKind::Store, format!("{name}={}: cannot read it: {e}", path.display())))
}

/// The connection options of every client of a cluster: timeouts, login and TLS.
pub(crate) fn options(access: &EtcdAccess, timeout: Duration) -> Result<ConnectOptions> {
    let mut options = ConnectOptions::new().with_connect_timeout(timeout).with_timeout(timeout);
    if let (Some(user), Some(password)) = (&access.user, &access.password) {
        options = options.with_user(user.as_str(), password.as_str());
    }
    if let Some(ca) = &access.ca {
        let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read("HCCN_ETCD_CA", ca)?));
        if let (Some(cert), Some(key)) = (&access.cert, &access.key) {
            tls = tls.identity(Identity::from_pem(read("HCCN_ETCD_CERT", cert)?, read("HCCN_ETCD_KEY", key)?));
        }
        options = options.with_tls(tls);
    }
    Ok(options)
}

/// Connects and reads one key, retrying while the cluster is unreachable (it may be starting,
/// or electing a leader) until `timeout`; a refusal ends the attempt at once.
pub(crate) async fn connect(
    endpoints: &[String],
    access: &EtcdAccess,
    options: ConnectOptions,
    timeout: Duration,
) -> Result<Client> {
    let deadline = Instant::now() + timeout;
    let at = endpoints.join(",");
    loop {
        let attempt = async {
            let mut client = Client::connect(endpoints, Some(options.clone())).await?;
            client.get(PROBE_KEY, Some(GetOptions::new().with_count_only())).await?;
            Ok::<_, etcd_client::Error>(client)
        };
        let e = match attempt.await {
            Ok(client) => return Ok(client),
            Err(e) => e,
        };
        let why = describe(&e);
        let refused = refusal(&e, &why, access).or_else(|| {
            let tls_port = access.ca.is_none() && endpoints.iter().any(|ep| closes_plain_requests(ep));
            tls_port.then(|| "a plain connection (it closes them unanswered: set HCCN_ETCD_CA if it serves TLS)".into())
        });
        if let Some(refusal) = refused {
            return Err(Error::new(ErrorKind::Store, format!("etcd at {at} refused this process: {refusal} ({why})")));
        }
        if Instant::now() >= deadline {
            let hint = if access.ca.is_none() { " (if it serves TLS, set HCCN_ETCD_CA)" } else { "" };
            return Err(Error::new(
                ErrorKind::Store,
                format!("etcd at {at} is unreachable within {} ms{hint}: {why}", timeout.as_millis()),
            ));
        }
        tracing::debug!("etcd at {at} not reached yet: {why}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the server at `endpoint` takes a TCP connection but closes it without a word when
/// asked for its version in plain HTTP: an etcd serving TLS does that (a plain one answers).
fn closes_plain_requests(endpoint: &str) -> bool {
    use std::io::{Read, Write};
    let Some(addr) = std::net::ToSocketAddrs::to_socket_addrs(endpoint).ok().and_then(|mut a| a.next()) else {
        return false;
    };
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("GET /version HTTP/1.0\r\nHost: {endpoint}\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut first = [0u8; 1];
    matches!(s.read(&mut first), Ok(0))
}

/// The error and its causes on one line (etcd-client's own text stops at "transport error").
pub(crate) fn describe(e: &etcd_client::Error) -> String {
    let inner: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::TransportError(t) => Some(t),
        etcd_client::Error::GRpcStatus(s) => Some(s),
        etcd_client::Error::IoError(io) => Some(io),
        _ => None,
    };
    let mut parts = vec![match e {
        etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        other => other.to_string(),
    }];
    let mut next = inner.and_then(|i| i.source());
    while let Some(cause) = next {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = cause.source();
    }
    parts.join(": ")
}

/// What the cluster refused, if the error is a refusal rather than a failure to reach it.
fn refusal(e: &etcd_client::Error, why: &str, access: &EtcdAccess) -> Option<String> {
    let login = || match &access.user {
        Some(user) => {
            format!("the login of HCCN_ETCD_USER={user} (user or HCCN_ETCD_PASSWORD wrong, or no access to /hccn/)")
        }
        None => "an anonymous client (its authentication is enabled: set HCCN_ETCD_USER and HCCN_ETCD_PASSWORD)".into(),
    };
    if let etcd_client::Error::GRpcStatus(s) = e {
        let m = s.message();
        // (tonic's codes, named without depending on tonic here.)
        let denied = matches!(format!("{:?}", s.code()).as_str(), "Unauthenticated" | "PermissionDenied")
            || m.contains("authentication failed")
            || m.contains("user name is empty")
            || m.contains("permission denied");
        if denied {
            return Some(login());
        }
    }
    let w = why.to_ascii_lowercase();
    let ca = access.ca.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    if w.contains("invalid peer certificate") {
        return Some(format!("its certificate is not signed by the CA of HCCN_ETCD_CA={ca}"));
    }
    if w.contains("alert") {
        return Some(match &access.cert {
            None => "the TLS handshake: it wants a client certificate (HCCN_ETCD_CERT and HCCN_ETCD_KEY)".into(),
            Some(cert) => {
                format!("the client certificate HCCN_ETCD_CERT={} (not signed by a CA it trusts)", cert.display())
            }
        });
    }
    let tls = ["certificate", "tls", "handshake", "corrupt message", "invalidcontenttype"];
    if tls.iter().any(|t| w.contains(t)) {
        return Some(match &access.ca {
            None => "a plain connection (it speaks TLS: set HCCN_ETCD_CA)".into(),
            Some(_) => format!("the TLS handshake with HCCN_ETCD_CA={ca}"),
        });
    }
    None
}
