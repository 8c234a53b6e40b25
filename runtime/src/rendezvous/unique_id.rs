//! The 128 opaque bytes of `hccn_unique_id`: what a rank needs to reach the store and prove it
//! belongs to the job, like ncclUniqueId.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::error::{Error, Result};

pub const UNIQUE_ID_BYTES: usize = 128;
const MAGIC: &[u8; 4] = b"HCID";
const VERSION: u8 = 1;

/// Layout: magic[4] version[1] family[1] port[2] ip[16] token[32] nonce[16], zero padding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueId {
    pub store: SocketAddr,
    pub token: [u8; 32],
    /// Distinguishes communicators built through the same store.
    pub nonce: [u8; 16],
}

impl UniqueId {
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[0..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        match self.store.ip() {
            IpAddr::V4(ip) => {
                b[5] = 4;
                b[8..12].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                b[5] = 6;
                b[8..24].copy_from_slice(&ip.octets());
            }
        }
        b[6..8].copy_from_slice(&self.store.port().to_be_bytes());
        b[24..56].copy_from_slice(&self.token);
        b[56..72].copy_from_slice(&self.nonce);
        b
    }

    pub fn from_bytes(b: &[u8; UNIQUE_ID_BYTES]) -> Result<Self> {
        if &b[0..4] != MAGIC || b[4] != VERSION {
            return Err(Error::invalid("unique id is not one made by hccn_get_unique_id (bad magic or version)"));
        }
        let ip = match b[5] {
            4 => IpAddr::V4(Ipv4Addr::new(b[8], b[9], b[10], b[11])),
            6 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(&b[8..24]);
                IpAddr::V6(Ipv6Addr::from(o))
            }
            f => return Err(Error::invalid(format!("unique id has unknown address family {f}"))),
        };
        let port = u16::from_be_bytes([b[6], b[7]]);
        let mut token = [0u8; 32];
        token.copy_from_slice(&b[24..56]);
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&b[56..72]);
        Ok(UniqueId { store: SocketAddr::new(ip, port), token, nonce })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let id = UniqueId { store: "127.0.0.1:4242".parse().expect("addr"), token: [7; 32], nonce: [9; 16] };
        assert_eq!(UniqueId::from_bytes(&id.to_bytes()).ok(), Some(id));
        assert!(UniqueId::from_bytes(&[0u8; UNIQUE_ID_BYTES]).is_err());
    }
}
