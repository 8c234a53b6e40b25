//! Mutual challenge-response keyed by the job token (HMAC-SHA256), run first on every store and
//! peer connection. Both sides send fresh nonces, so a captured exchange cannot be replayed, and
//! the token itself never crosses the wire.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, ErrorKind, Result};

/// The client's first bytes. Its blank line ends a request to an HTTP server, which then
/// answers at once (400): what it answers shows that it is no hccn store.
const HELLO: &[u8; 8] = b"HCCN\r\n\r\n";
/// The server's first bytes: a side that answers anything else speaks another protocol (an
/// echo, a banner, HTTP), which is said as such, not as a wrong token.
const ANSWER: &[u8; 8] = b"HCCNAUTH";
const NONCE: usize = 32;
const MAC: usize = 32;

/// What the connection is for; bound into the MACs so a store exchange is no peer exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Purpose {
    Store = 1,
    Peer = 2,
}

pub fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).map_err(|e| Error::new(ErrorKind::System, format!("no randomness: {e}")))?;
    Ok(b)
}

fn mac(token: &[u8], label: &[u8], purpose: Purpose, a: &[u8], b: &[u8]) -> Result<[u8; MAC]> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token).map_err(|e| Error::internal(format!("hmac key: {e}")))?;
    m.update(label);
    m.update(&[purpose as u8]);
    m.update(a);
    m.update(b);
    Ok(m.finalize().into_bytes().into())
}

fn verify(token: &[u8], label: &[u8], purpose: Purpose, a: &[u8], b: &[u8], tag: &[u8]) -> Result<bool> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token).map_err(|e| Error::internal(format!("hmac key: {e}")))?;
    m.update(label);
    m.update(&[purpose as u8]);
    m.update(a);
    m.update(b);
    Ok(m.verify_slice(tag).is_ok())
}

fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::io(ErrorKind::Auth, format!("handshake ({what})"), &e)
}

/// Client side: proves knowledge of the token and checks the server's proof.
pub fn client(stream: &mut TcpStream, token: &[u8], purpose: Purpose, timeout: Duration) -> Result<()> {
    stream.set_read_timeout(Some(timeout)).map_err(|e| io_err("timeout", e))?;
    client_io(stream, token, purpose)
}

/// The client's exchange over any byte stream (the fuzz targets drive it from memory).
pub fn client_io(stream: &mut (impl Read + Write), token: &[u8], purpose: Purpose) -> Result<()> {
    let nonce_c: [u8; NONCE] = random_bytes()?;
    let mut hello = Vec::with_capacity(HELLO.len() + 1 + NONCE);
    hello.extend_from_slice(HELLO);
    hello.push(purpose as u8);
    hello.extend_from_slice(&nonce_c);
    stream.write_all(&hello).map_err(|e| io_err("hello", e))?;
    let mut answer = [0u8; ANSWER.len()];
    stream.read_exact(&mut answer).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::new(
            ErrorKind::Timeout,
            "the other side accepted the connection but never answered hccn's handshake (not an hccn process, \
             or one that is stuck)",
        ),
        std::io::ErrorKind::UnexpectedEof => foreign(purpose, b"(closed)"),
        _ => io_err("challenge", e),
    })?;
    if &answer != ANSWER {
        return Err(foreign(purpose, &answer));
    }
    let mut reply = [0u8; NONCE + MAC];
    stream.read_exact(&mut reply).map_err(|e| io_err("challenge", e))?;
    let (nonce_s, mac_s) = reply.split_at(NONCE);
    if !verify(token, b"hccn-server", purpose, &nonce_c, nonce_s, mac_s)? {
        return Err(Error::new(ErrorKind::Auth, "the other side does not hold this job's token (HCCN_JOB_TOKEN)"));
    }
    stream.write_all(&mac(token, b"hccn-client", purpose, nonce_s, &nonce_c)?).map_err(|e| io_err("proof", e))?;
    let mut ok = [0u8; 1];
    stream.read_exact(&mut ok).map_err(|e| io_err("verdict", e))?;
    if ok[0] != 1 {
        return Err(Error::new(ErrorKind::Auth, "refused by the other side: job token mismatch"));
    }
    Ok(())
}

/// The error of a side that answered `first` where an hccn store or rank answers [`ANSWER`].
fn foreign(purpose: Purpose, first: &[u8]) -> Error {
    let shown: String =
        first.iter().map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' }).collect();
    let (kind, what) = match purpose {
        Purpose::Store => (ErrorKind::Store, "an hccn store"),
        Purpose::Peer => (ErrorKind::Connect, "an hccn rank"),
    };
    let said = match first == HELLO {
        true => "it sent back what it was sent (an echo service?)".to_owned(),
        false => format!("it answered {shown:?}..., which no hccn process sends"),
    };
    Error::new(kind, format!("the other side is not {what}: {said}"))
}

/// Server side: the connection is usable only when this returns `Ok`.
pub fn server(stream: &mut TcpStream, token: &[u8], purpose: Purpose, timeout: Duration) -> Result<()> {
    stream.set_read_timeout(Some(timeout)).map_err(|e| io_err("timeout", e))?;
    server_io(stream, token, purpose)
}

/// The server's exchange over any byte stream (the fuzz targets drive it from memory).
pub fn server_io(stream: &mut (impl Read + Write), token: &[u8], purpose: Purpose) -> Result<()> {
    let mut hello = [0u8; HELLO.len() + 1 + NONCE];
    stream.read_exact(&mut hello).map_err(|e| io_err("hello", e))?;
    if &hello[..HELLO.len()] != HELLO || hello[HELLO.len()] != purpose as u8 {
        return Err(Error::new(ErrorKind::Auth, "not an hccn handshake for this purpose"));
    }
    let nonce_c = &hello[HELLO.len() + 1..];
    let nonce_s: [u8; NONCE] = random_bytes()?;
    let mut reply = Vec::with_capacity(ANSWER.len() + NONCE + MAC);
    reply.extend_from_slice(ANSWER);
    reply.extend_from_slice(&nonce_s);
    reply.extend_from_slice(&mac(token, b"hccn-server", purpose, nonce_c, &nonce_s)?);
    stream.write_all(&reply).map_err(|e| io_err("challenge", e))?;
    let mut proof = [0u8; MAC];
    stream.read_exact(&mut proof).map_err(|e| io_err("proof", e))?;
    let good = verify(token, b"hccn-client", purpose, &nonce_s, nonce_c, &proof)?;
    // Best effort: the client learns the verdict; a rogue one may already be gone.
    let _ = stream.write_all(&[u8::from(good)]);
    if !good {
        return Err(Error::new(ErrorKind::Auth, "client does not hold this job's token"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(server_token: &'static [u8], client_token: &'static [u8]) -> (Result<()>, Result<()>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            server(&mut s, server_token, Purpose::Peer, Duration::from_secs(5))
        });
        let mut c = TcpStream::connect(addr).expect("connect");
        let rc = client(&mut c, client_token, Purpose::Peer, Duration::from_secs(5));
        drop(c);
        (rc, t.join().expect("server thread"))
    }

    #[test]
    fn same_token_passes_wrong_token_fails_both_sides() {
        let (c, s) = pair(b"k1", b"k1");
        assert!(c.is_ok() && s.is_ok());
        let (c, s) = pair(b"k1", b"k2");
        assert_eq!(c.err().map(|e| e.kind()), Some(ErrorKind::Auth));
        assert!(s.is_err());
    }
}
