//! The fixed frame header every peer message starts with. A receiver checks magic, version and
//! kind on arrival and the length against [`MAX_CHUNK_BYTES`](crate::config::MAX_CHUNK_BYTES)
//! before reading the payload; the matching receive then checks communicator, sequence, the
//! operation's fingerprint, tag and exact length before a byte reaches user memory.

use crate::error::{Error, ErrorKind, Result};

pub const MAGIC: u32 = 0x4843_434e; // "HCCN"
/// hccn's protocol: of this header, of the hello after a handshake and of the records ranks
/// publish in the store (rendezvous/ondemand.rs), which name it first so that ranks running
/// another protocol are told so when they meet. Version 2 added the fingerprint; 3 named the
/// protocol in the records.
pub const VERSION: u16 = 4;
pub const HEADER_LEN: usize = 64;

/// What every rank's call of one operation must agree on (`collectives::fingerprint` makes and
/// reads it), carried by each of its frames: a receiver whose own call differs refuses the
/// frame with HCCN_ERROR_MISMATCH instead of mixing two different calls' data. Zero for frames
/// outside operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fingerprint {
    /// The kind of operation (0: none).
    pub op: u8,
    /// Data type + 1 (0: none).
    pub dtype: u8,
    /// Reduce operation + 1 (0: none).
    pub redop: u8,
    /// Root rank, or `u32::MAX` for operations without one.
    pub root: u32,
    /// Elements of the call (what each kind counts: see `collectives::fingerprint`).
    pub count: u64,
}

impl Fingerprint {
    pub const BYTES: usize = 16;
    /// The byte of the encoding that carries nothing (zero).
    pub const PADDING: usize = 3;

    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0] = self.op;
        b[1] = self.dtype;
        b[2] = self.redop;
        b[4..8].copy_from_slice(&self.root.to_le_bytes());
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; Self::BYTES]) -> Self {
        Fingerprint {
            op: b[0],
            dtype: b[1],
            redop: b[2],
            root: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            count: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Part of a collective; `seq` is the communicator's collective sequence number.
    Collective = 1,
    /// Point-to-point; `seq` counts messages from this sender to this receiver.
    P2p = 2,
    /// The sender is closing the connection on purpose (not a failure); payload: the failures
    /// it knew of (`transport::news`), so that what made it leave is not lost with it.
    Goodbye = 3,
    /// Agreement among survivors (shrink); `seq` numbers the shrink, `tag` its coordinator.
    Agree = 4,
    /// The sender revoked communicator `comm_id`: every operation on it must fail.
    Revoke = 5,
    /// The sender is alive (sent every `HCCN_HEARTBEAT_MS`); no payload.
    Heartbeat = 6,
    /// The sender lost peers (payload: their world ranks, whether each is surely dead, why), so
    /// that every rank learns of a failure as soon as one sees it (`transport::news`).
    Suspect = 7,
    /// The sender declared this rank dead (it was silent) and closes the connection; payload:
    /// why. A frozen rank that wakes up learns from it that it was left behind.
    Evict = 8,
    /// The sender's part of collective `seq` of communicator `comm_id` failed (it left the
    /// operation, so ranks waiting for it would wait in vain): every rank's operation `seq`
    /// fails with the same error (payload: `transport::news::encode_abandon`).
    Abandon = 9,
    /// Who the sender is: its incarnation id (8 bytes: how news names it, see
    /// `transport::news`) and its pulse port (2 bytes, 0 for none; `transport::pulse`).
    Intro = 10,
    /// News passed on (worlds that connect on demand, where not every rank has a link to the
    /// one that saw a loss): the reporter's incarnation (8 bytes), then its `Suspect` payload.
    Relay = 11,
}

impl FrameKind {
    fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            1 => Some(FrameKind::Collective),
            2 => Some(FrameKind::P2p),
            3 => Some(FrameKind::Goodbye),
            4 => Some(FrameKind::Agree),
            5 => Some(FrameKind::Revoke),
            6 => Some(FrameKind::Heartbeat),
            7 => Some(FrameKind::Suspect),
            8 => Some(FrameKind::Evict),
            9 => Some(FrameKind::Abandon),
            10 => Some(FrameKind::Intro),
            11 => Some(FrameKind::Relay),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub comm_id: u64,
    pub epoch: u64,
    pub seq: u64,
    pub tag: u32,
    pub len: u64,
    pub fp: Fingerprint,
}

impl FrameHeader {
    /// A header of a frame outside any operation (control, agreement): no fingerprint.
    pub fn control(kind: FrameKind, comm_id: u64, epoch: u64, seq: u64, len: usize) -> Self {
        FrameHeader { kind, comm_id, epoch, seq, tag: 0, len: len as u64, fp: Fingerprint::default() }
    }
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6] = self.kind as u8;
        // b[7] flags, b[36..40] and the fingerprint's padding b[51] reserved: zero in version 1.
        b[8..16].copy_from_slice(&self.comm_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.epoch.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..36].copy_from_slice(&self.tag.to_le_bytes());
        b[40..48].copy_from_slice(&self.len.to_le_bytes());
        b[48..64].copy_from_slice(&self.fp.encode());
        b
    }

    /// Parses and checks a header; `max_len` bounds the payload the receiver will accept.
    pub fn decode(b: &[u8; HEADER_LEN], max_len: usize) -> Result<Self> {
        let le32 = |r: std::ops::Range<usize>| u32::from_le_bytes(b[r].try_into().unwrap_or([0; 4]));
        let le64 = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().unwrap_or([0; 8]));
        let bad = |what: String| Error::new(ErrorKind::Transfer, format!("malformed frame: {what}"));
        if le32(0..4) != MAGIC {
            return Err(bad(format!("bad magic {:#010x}", le32(0..4))));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(bad(format!("protocol version {version}, expected {VERSION}")));
        }
        let kind = FrameKind::from_raw(b[6]).ok_or_else(|| bad(format!("unknown kind {}", b[6])))?;
        if b[7] != 0 || le32(36..40) != 0 || b[48 + Fingerprint::PADDING] != 0 {
            return Err(bad("reserved bits set".into()));
        }
        let len = le64(40..48);
        if len > max_len as u64 {
            return Err(bad(format!("length {len} exceeds the limit of {max_len} bytes")));
        }
        let fp = Fingerprint::decode(b[48..64].try_into().unwrap_or(&[0; Fingerprint::BYTES]));
        Ok(FrameHeader {
            kind,
            comm_id: le64(8..16),
            epoch: le64(16..24),
            seq: le64(24..32),
            tag: le32(32..36),
            len,
            fp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let fp = Fingerprint { op: 3, dtype: 5, redop: 0, root: 1, count: 77 };
        let h = FrameHeader { kind: FrameKind::P2p, comm_id: 7, epoch: 2, seq: 99, tag: 5, len: 1024, fp };
        let b = h.encode();
        assert_eq!(FrameHeader::decode(&b, 4096).ok(), Some(h));
        assert!(FrameHeader::decode(&b, 1000).is_err(), "length over limit");
        let mut m = b;
        m[0] ^= 1;
        assert!(FrameHeader::decode(&m, 4096).is_err(), "magic");
        let mut m = b;
        m[6] = 42;
        assert!(FrameHeader::decode(&m, 4096).is_err(), "kind");
        let mut m = b;
        m[4] = 9;
        assert!(FrameHeader::decode(&m, 4096).is_err(), "version");
        // Found by the frame fuzzer: a header that decodes must be the one encoding of itself.
        for reserved in [7, 36, 39, 48 + Fingerprint::PADDING] {
            let mut m = b;
            m[reserved] = 0x4e;
            assert!(FrameHeader::decode(&m, 4096).is_err(), "reserved byte {reserved}");
        }
    }
}
