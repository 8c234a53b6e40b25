//! Entry points for the fuzz targets in `fuzz/` (not part of the supported API): each feeds
//! untrusted bytes to one decoder exactly as the network would, and panics only where the
//! decoder broke a property it promises (a round trip, or a refusal of a forgery).

use std::io::{Read, Write};

use crate::auth::{self, Purpose};
use crate::wire::{FrameHeader, HEADER_LEN};

/// A socket made of memory: reads come from the input, writes are kept.
#[derive(Debug)]
pub struct Duplex<'a> {
    input: &'a [u8],
    pub output: Vec<u8>,
}

impl<'a> Duplex<'a> {
    pub fn new(input: &'a [u8]) -> Self {
        Duplex { input, output: Vec::new() }
    }
}

impl Read for Duplex<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Duplex<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A frame header as a rank's progress engine receives it: a refusal, or a header that encodes
/// back to the same bytes and respects the length limit.
pub fn frame_header(data: &[u8]) {
    let Some(head) = data.get(..HEADER_LEN) else { return };
    let mut b = [0u8; HEADER_LEN];
    b.copy_from_slice(head);
    let limit = crate::config::MAX_CHUNK_BYTES;
    if let Ok(h) = FrameHeader::decode(&b, limit) {
        assert!(h.len <= limit as u64, "accepted a frame of {} bytes", h.len);
        assert_eq!(h.encode(), b, "an accepted header does not encode back to its bytes");
    }
}

/// The embedded store's request loop, fed `data` as one authenticated client.
pub fn store_protocol(data: &[u8]) {
    let (_, out) = crate::rendezvous::serve_bytes(data);
    // Every reply is `status u8 | len u32 | data` with a known status.
    let mut rest = &out[..];
    while !rest.is_empty() {
        assert!(rest.len() >= 5 && rest[0] <= 3, "malformed store reply");
        let len = u32::from_le_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        assert!(rest.len() >= 5 + len, "store reply shorter than its length");
        rest = &rest[5 + len..];
    }
}

/// Both sides of the job-token handshake, fed `data` by an attacker without the token: neither
/// side may ever accept.
pub fn handshake(data: &[u8]) {
    let token = b"the job token";
    let (purpose, data) = match data.split_first() {
        Some((p, rest)) if p % 2 == 0 => (Purpose::Store, rest),
        Some((_, rest)) => (Purpose::Peer, rest),
        None => return,
    };
    let mut s = Duplex::new(data);
    assert!(auth::server_io(&mut s, token, purpose).is_err(), "server accepted a forged handshake");
    let mut c = Duplex::new(data);
    assert!(auth::client_io(&mut c, token, purpose).is_err(), "client accepted a forged server");
}

/// What ranks read from each other or from the store while they bootstrap: the unique id, store
/// addresses, a peer's hello, a joiner's admission record, peer addresses, shrink agreement
/// messages. Each is refused or round-trips.
pub fn bootstrap(data: &[u8]) {
    let Some((&which, data)) = data.split_first() else { return };
    match which % 6 {
        0 => {
            let mut b = [0u8; 128];
            let n = data.len().min(b.len());
            b[..n].copy_from_slice(&data[..n]);
            if let Ok(id) = crate::rendezvous::UniqueId::from_bytes(&b) {
                let again = crate::rendezvous::UniqueId::from_bytes(&id.to_bytes()).ok();
                assert_eq!(again, Some(id), "unique id does not round-trip");
            }
        }
        1 => {
            // Only literal addresses: a host name would make the target do DNS look-ups.
            let Ok(text) = std::str::from_utf8(data) else { return };
            let literal = |s: &str| s.bytes().all(|c| c.is_ascii_digit() || b".:[],".contains(&c));
            let ok = match text.split_once("://") {
                Some((_, rest)) => literal(rest),
                None => literal(text),
            };
            if ok {
                if let Ok(addr) = crate::rendezvous::StoreAddr::parse(text) {
                    let again = crate::rendezvous::StoreAddr::parse(&addr.to_string()).ok();
                    assert_eq!(again, Some(addr), "store address does not round-trip");
                }
            }
        }
        2 => {
            let mut h = [0u8; 16];
            let n = data.len().min(16);
            h[..n].copy_from_slice(&data[..n]);
            let (mesh, rank, size) = crate::rendezvous::bootstrap::parse_hello(&h);
            assert_eq!(crate::rendezvous::bootstrap::hello(mesh, rank, size), h, "hello does not round-trip");
        }
        3 => {
            if let Ok(a) = crate::comm::join::Admission::decode(data) {
                let again = crate::comm::join::Admission::decode(&a.encode()).ok();
                assert_eq!(again, Some(a), "admission record does not round-trip");
            }
        }
        4 => {
            // A peer or joiner address read from the store.
            let text = String::from_utf8_lossy(data);
            if let Ok(addr) = text.parse::<std::net::SocketAddr>() {
                assert_eq!(addr.to_string().parse::<std::net::SocketAddr>().ok(), Some(addr));
            }
        }
        _ => {
            let Some((&n, msg)) = data.split_first() else { return };
            let n = u32::from(n) + 1;
            if let Some(m) = crate::comm::agree::decode(msg, n) {
                assert_eq!(crate::comm::agree::encode(&m), msg, "agreement message does not round-trip");
            }
        }
    }
}
