//! What ranks tell each other about failures, on the control frames `Suspect` (a rank lost
//! peers), `Goodbye` (a rank leaves, and says what it knew), `Evict` (a rank declared the
//! receiver dead) and `Abandon` (a rank left an operation). One encoding for all: a list of
//! faults, each a process, whether it is surely gone, and why. Processes are named by their
//! incarnation ids (see `Intro` frames), not world ranks: a replacement that joined later
//! numbers the world differently from the ranks that formed it.

/// Why a peer can no longer be reached from this rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    pub reason: String,
    /// The peer's process is gone for sure: its connection ended without a goodbye (the kernel
    /// closes a dead process's sockets). A silent peer, or one that declared this rank dead, may
    /// be alive on the other side of a partition, and counts only as cut off from this rank.
    pub sure: bool,
}

impl Fault {
    pub fn sure(reason: impl Into<String>) -> Fault {
        Fault { reason: reason.into(), sure: true }
    }

    pub fn cut(reason: impl Into<String>) -> Fault {
        Fault { reason: reason.into(), sure: false }
    }
}

/// Most faults one message carries, and the longest reason kept: a peer cannot make a rank
/// allocate more than about a megabyte for its news.
pub(crate) const MAX_FAULTS: usize = 4096;
const MAX_REASON: usize = 240;

/// Encodes `(incarnation, fault)` pairs.
pub(crate) fn encode(faults: &[(u64, Fault)]) -> Vec<u8> {
    let mut out = Vec::new();
    let faults = &faults[..faults.len().min(MAX_FAULTS)];
    out.extend_from_slice(&(faults.len() as u32).to_le_bytes());
    for (rank, f) in faults {
        let reason = encode_text(&f.reason, MAX_REASON);
        out.extend_from_slice(&rank.to_le_bytes());
        out.push(f.sure as u8);
        out.push(reason.len() as u8);
        out.extend_from_slice(reason);
    }
    out
}

/// A [`FrameKind::Relay`](crate::wire::FrameKind::Relay) payload: news of `reporter` (an
/// incarnation), passed on.
pub(crate) fn encode_relay(reporter: u64, faults: &[(u64, Fault)]) -> Vec<u8> {
    let mut out = reporter.to_le_bytes().to_vec();
    out.extend_from_slice(&encode(faults));
    out
}

/// Decodes what [`encode_relay`] made; `None` for anything malformed.
pub(crate) fn decode_relay(b: &[u8]) -> Option<(u64, Vec<(u64, Fault)>)> {
    let (reporter, rest) = b.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*reporter), decode(rest)?))
}

/// Decodes what [`encode`] made; `None` for anything malformed.
pub(crate) fn decode(b: &[u8]) -> Option<Vec<(u64, Fault)>> {
    let (n, mut rest) = b.split_first_chunk::<4>()?;
    let n = u32::from_le_bytes(*n) as usize;
    if n > MAX_FAULTS {
        return None;
    }
    let mut faults = Vec::with_capacity(n);
    for _ in 0..n {
        let (who, r) = rest.split_first_chunk::<8>()?;
        let (&[sure, len], r) = r.split_first_chunk::<2>()?;
        if sure > 1 {
            return None;
        }
        let reason = std::str::from_utf8(r.get(..len as usize)?).ok()?;
        faults.push((u64::from_le_bytes(*who), Fault { reason: reason.to_owned(), sure: sure == 1 }));
        rest = &r[len as usize..];
    }
    rest.is_empty().then_some(faults)
}

/// Why a rank left an operation (the payload of `Abandon`): the error it got, in its terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Abandoned {
    pub kind: crate::error::ErrorKind,
    /// The ranks went separate ways: the communicator cannot run any later operation either.
    pub broken: bool,
    /// World ranks the error is about (incarnations on the wire).
    pub ranks: Vec<u32>,
    pub message: String,
}

/// Longest message an `Abandon` carries.
const MAX_MESSAGE: usize = 2048;

/// Encodes `a`, naming its ranks by the incarnations `ids` gives.
pub(crate) fn encode_abandon(a: &Abandoned, ids: &dyn Fn(u32) -> Option<u64>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&a.kind.code().to_le_bytes());
    out.push(a.broken as u8);
    let who: Vec<u64> = a.ranks.iter().filter_map(|r| ids(*r)).take(MAX_FAULTS).collect();
    out.extend_from_slice(&(who.len() as u32).to_le_bytes());
    who.iter().for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
    out.extend_from_slice(encode_text(&a.message, MAX_MESSAGE));
    out
}

/// Decodes what [`encode_abandon`] made, naming ranks by `rank_of` an incarnation (unknown
/// ones are left out).
pub(crate) fn decode_abandon(b: &[u8], rank_of: &dyn Fn(u64) -> Option<u32>) -> Option<Abandoned> {
    let (code, b) = b.split_first_chunk::<4>()?;
    let kind = crate::error::ErrorKind::from_code(u32::from_le_bytes(*code))?;
    let (&broken, b) = b.split_first()?;
    let (n, mut b) = b.split_first_chunk::<4>()?;
    let n = u32::from_le_bytes(*n) as usize;
    if n > MAX_FAULTS || broken > 1 {
        return None;
    }
    let mut ranks = Vec::with_capacity(n);
    for _ in 0..n {
        let (w, rest) = b.split_first_chunk::<8>()?;
        ranks.extend(rank_of(u64::from_le_bytes(*w)));
        b = rest;
    }
    let message = std::str::from_utf8(b).ok().filter(|m| m.len() <= MAX_MESSAGE)?.to_owned();
    Some(Abandoned { kind, broken: broken == 1, ranks, message })
}

/// `text` cut to at most `max` bytes on a character boundary.
fn encode_text(text: &str, max: usize) -> &[u8] {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text.as_bytes()[..end]
}

/// Encodes a plain reason (the payload of `Evict`).
pub(crate) fn encode_reason(reason: &str) -> Vec<u8> {
    encode_text(reason, MAX_REASON).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_round_trip_and_garbage_is_refused() {
        let faults = vec![(3, Fault::sure("connection closed")), (7, Fault::cut("silent for 900 ms: é"))];
        let b = encode(&faults);
        assert_eq!(decode(&b), Some(faults));
        assert_eq!(decode(&b[..b.len() - 1]), None, "truncated");
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[0xff, 0xff, 0xff, 0xff]), None, "absurd count");
        assert_eq!(decode(&encode(&[])), Some(vec![]));
        let mut bad = encode(&[(1, Fault::sure("x"))]);
        bad[12] = 2;
        assert_eq!(decode(&bad), None, "a flag that is neither 0 nor 1");
        let long = "x".repeat(1000);
        let back = decode(&encode(&[(1, Fault::cut(long))])).expect("decodes");
        assert_eq!(back[0].1.reason.len(), MAX_REASON, "reasons are cut to a bounded length");
    }

    #[test]
    fn abandons_round_trip_and_garbage_is_refused() {
        let a = Abandoned {
            kind: crate::error::ErrorKind::Mismatch,
            broken: true,
            ranks: vec![1, 3],
            message: "rank 1 called allreduce with 200 elements".into(),
        };
        let ids = |r: u32| Some(u64::from(r) + 100);
        let ranks = |w: u64| w.checked_sub(100).map(|r| r as u32);
        let b = encode_abandon(&a, &ids);
        assert_eq!(decode_abandon(&b, &ranks), Some(a));
        assert_eq!(decode_abandon(&b[..8], &ranks), None);
        let mut bad = b.clone();
        bad[0] = 200;
        assert_eq!(decode_abandon(&bad, &ranks), None, "an unknown result code");
    }
}
