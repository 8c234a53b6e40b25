//! The fingerprint of a call (`wire::Fingerprint`): what every rank's call of one operation must
//! agree on. Every frame and every board post of an operation carries it, and a receiver whose
//! own call differs fails with HCCN_ERROR_MISMATCH, saying what differed in the caller's terms,
//! instead of mixing two different calls' data. Operations whose data does not flow from every
//! rank to every rank (rooted ones, count 0) end with a barrier that carries it (see
//! `verify.rs`), so that every rank of a mismatched call learns of it.

use super::Op;
use crate::types::{DataType, ReduceOp};
use crate::wire::Fingerprint;

/// The operation kinds, by the numbers a fingerprint carries (never renumbered): the index of
/// each name in [`NAMES`]. Constants, so that building a fingerprint costs no look-up.
const ALLREDUCE: u8 = 1;
const ALLREDUCE_COMPRESSED: u8 = 2;
const BROADCAST: u8 = 3;
const REDUCE: u8 = 4;
const ALLGATHER: u8 = 5;
const ALLGATHERV: u8 = 6;
const REDUCE_SCATTER: u8 = 7;
const GATHER: u8 = 8;
const SCATTER: u8 = 9;
const ALLTOALL: u8 = 10;
const ALLTOALLV: u8 = 11;
const SEND_RECV: u8 = 12;
const BARRIER: u8 = 13;
const NAMES: [&str; 14] = [
    "an unknown operation",
    "allreduce",
    "allreduce_compressed",
    "broadcast",
    "reduce",
    "allgather",
    "allgatherv",
    "reduce_scatter",
    "gather",
    "scatter",
    "alltoall",
    "alltoallv",
    "send/recv",
    "barrier",
];

const NO_ROOT: u32 = u32::MAX;

/// Set in the kind of a call that its rank refused (an argument failed a check there): the call
/// still takes its place among the other ranks' calls, which then fail, naming that rank,
/// instead of pairing with its next call (see comm/refuse.rs).
const REFUSED: u8 = 0x80;

fn kind_name(code: u8) -> &'static str {
    NAMES.get(usize::from(code & !REFUSED)).copied().unwrap_or(NAMES[0])
}

/// The fingerprint of the call `f` refused on the rank that made it: equal to no accepted call's,
/// and to the same call refused on another rank.
pub(crate) fn refused(f: &Fingerprint) -> Fingerprint {
    Fingerprint { op: f.op | REFUSED, ..*f }
}

fn is_refused(f: &Fingerprint) -> bool {
    f.op & REFUSED != 0
}

fn fp(op: u8, dt: Option<DataType>, redop: Option<ReduceOp>, root: u32, count: u64) -> Fingerprint {
    Fingerprint { op, dtype: dt.map_or(0, |d| d as u8 + 1), redop: redop.map_or(0, |o| o as u8 + 1), root, count }
}

/// A digest of a counts array (allgatherv): equal arrays give equal digests.
fn digest(counts: &[u64]) -> u64 {
    counts.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, c| (h ^ c).wrapping_mul(0x100_0000_01b3))
}

/// The fingerprint of `op` as the caller passed it. Send and receive share one kind, so that a
/// receive checks the element count and type of the send it matches.
#[inline]
pub(crate) fn of(op: &Op) -> Fingerprint {
    match op {
        Op::AllReduce { count, dt, op, .. } => fp(ALLREDUCE, Some(*dt), Some(*op), NO_ROOT, *count),
        // The wire type goes where a root would: both must agree.
        Op::AllReduceCompressed { count, dt, wire, op, .. } => {
            fp(ALLREDUCE_COMPRESSED, Some(*dt), Some(*op), *wire as u32, *count)
        }
        Op::Broadcast { count, dt, root, .. } => fp(BROADCAST, Some(*dt), None, *root, *count),
        Op::Reduce { count, dt, op, root, .. } => fp(REDUCE, Some(*dt), Some(*op), *root, *count),
        Op::AllGather { send_count, dt, .. } => fp(ALLGATHER, Some(*dt), None, NO_ROOT, *send_count),
        Op::AllGatherV { recv_counts, dt, .. } => fp(ALLGATHERV, Some(*dt), None, NO_ROOT, digest(recv_counts)),
        Op::ReduceScatter { recv_count, dt, op, .. } => fp(REDUCE_SCATTER, Some(*dt), Some(*op), NO_ROOT, *recv_count),
        Op::Gather { send_count, dt, root, .. } => fp(GATHER, Some(*dt), None, *root, *send_count),
        Op::Scatter { recv_count, dt, root, .. } => fp(SCATTER, Some(*dt), None, *root, *recv_count),
        Op::AllToAll { count_per_rank, dt, .. } => fp(ALLTOALL, Some(*dt), None, NO_ROOT, *count_per_rank),
        // Each pair's block lengths are checked frame by frame.
        Op::AllToAllV { dt, .. } => fp(ALLTOALLV, Some(*dt), None, NO_ROOT, 0),
        Op::Send { count, dt, .. } | Op::Recv { count, dt, .. } => fp(SEND_RECV, Some(*dt), None, NO_ROOT, *count),
        Op::Barrier => fp(BARRIER, None, None, NO_ROOT, 0),
    }
}

/// The fingerprint of a call of `kind` (an `Op::name`) refused on a rank that could not read its
/// other arguments (an unknown data type or reduce operation, say).
pub(crate) fn refused_unread(kind: &str) -> Fingerprint {
    let code = NAMES.iter().position(|k| *k == kind).unwrap_or(0) as u8;
    refused(&fp(code, None, None, NO_ROOT, 0))
}

/// The largest post of the call `f` on the board of a communicator of `n` ranks (what decides
/// whether it goes there): the buffer of an allreduce, reduce or broadcast, a rank's block of an
/// allgather or gather, the whole input of a reduce-scatter, scatter or alltoall. `None` for calls
/// that never go to the board: those whose counts differ by rank (allgatherv, alltoallv), the
/// compressed allreduce (its point is the wire type) and send/receive.
#[inline]
pub(crate) fn board_post(f: &Fingerprint, n: u32) -> Option<usize> {
    // A refused call goes where the call would have gone: its round keeps the board's turns.
    let per_rank = match f.op & !REFUSED {
        BARRIER => return Some(0),
        ALLREDUCE | REDUCE | BROADCAST | ALLGATHER | GATHER => 1,
        REDUCE_SCATTER | SCATTER | ALLTOALL => n as usize,
        _ => return None,
    };
    if is_refused(f) && f.dtype == 0 {
        // Refused unread (see `refused_unread`): its size is unknown, so it posts only its
        // fingerprint wherever a call of its kind may go, and the others' calls, on the board
        // or not, fail against it.
        return Some(0);
    }
    // On every small call's path: a look-up, no fallible conversion.
    let size = DataType::ALL.get(usize::from(f.dtype.checked_sub(1)?))?.size();
    Some((f.count as usize).saturating_mul(size).saturating_mul(per_rank))
}

/// A fingerprint of collective `op` (an `Op::name`) over `bytes` (the whole buffer, as
/// `select::plan_name` reads it) on `n` ranks, for tools that ask what a call would do.
pub(crate) fn for_plan(op: &str, bytes: usize, n: u32) -> Option<Fingerprint> {
    let count = match op {
        "allreduce" | "reduce" | "broadcast" => bytes,
        "allgather" | "gather" | "reduce_scatter" | "scatter" | "alltoall" => bytes / n.max(1) as usize,
        "barrier" => 0,
        _ => return None,
    };
    let code = NAMES.iter().position(|k| *k == op)? as u8;
    Some(fp(code, Some(DataType::Uint8), None, NO_ROOT, count as u64))
}

/// Whether the call's per-rank counts are outside its fingerprint (alltoallv: only the pair a
/// block concerns can check it).
pub(crate) fn varies(f: &Fingerprint) -> bool {
    f.op & !REFUSED == ALLTOALLV
}

/// The call a fingerprint stands for, as the caller wrote it: "allreduce of 100 fp32 elements
/// (sum)", "broadcast of 8 int8 elements from root 2".
pub(crate) fn describe(f: &Fingerprint) -> String {
    let name = kind_name(f.op);
    if name == "barrier" {
        return "barrier".to_owned();
    }
    let dt = f.dtype.checked_sub(1).and_then(|d| DataType::from_raw(d.into()).ok());
    let mut out = match (name, dt) {
        ("allgatherv", Some(dt)) => {
            format!("allgatherv of {} elements (receive counts digest {:016x})", dt.name(), f.count)
        }
        ("alltoallv", Some(dt)) => format!("alltoallv of {} elements", dt.name()),
        (_, Some(dt)) => format!("{name} of {} {} elements", f.count, dt.name()),
        (_, None) => name.to_owned(),
    };
    if let Some(op) = f.redop.checked_sub(1).and_then(|o| ReduceOp::from_raw(o.into()).ok()) {
        out.push_str(&format!(" ({})", op.name()));
    }
    match name {
        "allreduce_compressed" => {
            let wire = DataType::from_raw(f.root).map_or("?", |d| d.name());
            out.push_str(&format!(" carried as {wire}"));
        }
        _ if f.root != NO_ROOT => out.push_str(&format!(" from root {}", f.root)),
        _ => {}
    }
    out
}

/// What differs between two calls, in the caller's terms: "the element counts differ (100 and
/// 200)".
pub(crate) fn difference(a: &Fingerprint, b: &Fingerprint) -> String {
    let mut parts = Vec::new();
    if a.op != b.op {
        parts.push(format!("different operations ({} and {})", kind_name(a.op), kind_name(b.op)));
    } else {
        if a.dtype != b.dtype {
            parts.push("the data types differ".to_owned());
        }
        if a.count != b.count {
            parts.push(match kind_name(a.op) {
                "allgatherv" => "the receive counts differ".to_owned(),
                _ => format!("the element counts differ ({} and {})", a.count, b.count),
            });
        }
        if a.redop != b.redop {
            parts.push("the reduce operations differ".to_owned());
        }
        if a.root != b.root {
            parts.push(match kind_name(a.op) {
                "allreduce_compressed" => "the wire types differ".to_owned(),
                _ => format!("the roots differ ({} and {})", a.root, b.root),
            });
        }
    }
    parts.join(", ")
}

/// The error of a call that met another rank's different call of the same operation.
pub(crate) fn mismatch(mine: &Fingerprint, me: u32, theirs: &Fingerprint, them: u32) -> crate::error::Error {
    let message = match (is_refused(theirs), is_refused(mine)) {
        (true, _) => format!(
            "rank {them} refused its {} (an argument failed a check on that rank; its error says which), so rank \
             {me}'s {} fails too",
            describe(theirs),
            describe(&Fingerprint { op: mine.op & !REFUSED, ..*mine })
        ),
        (false, true) => format!(
            "this rank (rank {me}) refused its {}, which rank {them} called as {}",
            describe(mine),
            describe(theirs)
        ),
        (false, false) => format!(
            "ranks called collective operation differently: rank {them} called {}, rank {me} called {}: {}",
            describe(theirs),
            describe(mine),
            difference(mine, theirs)
        ),
    };
    crate::error::Error::new(crate::error::ErrorKind::Mismatch, message).with_failed(vec![them, me])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::Ptr;

    fn allreduce(count: u64, dt: DataType, op: ReduceOp) -> Fingerprint {
        of(&Op::AllReduce { send: Ptr::null(), recv: Ptr::null(), count, dt, op })
    }

    #[test]
    fn mismatches_are_told_in_the_callers_terms() {
        let a = allreduce(100, DataType::Fp32, ReduceOp::Sum);
        let b = allreduce(200, DataType::Fp32, ReduceOp::Sum);
        assert_eq!(describe(&a), "allreduce of 100 fp32 elements (sum)");
        assert_eq!(difference(&a, &b), "the element counts differ (100 and 200)");
        let c = allreduce(100, DataType::Fp64, ReduceOp::Max);
        assert_eq!(difference(&a, &c), "the data types differ, the reduce operations differ");
        let bcast = |root| of(&Op::Broadcast { buf: Ptr::null(), count: 8, dt: DataType::Int8, root });
        assert_eq!(describe(&bcast(2)), "broadcast of 8 int8 elements from root 2");
        assert_eq!(difference(&bcast(0), &bcast(1)), "the roots differ (0 and 1)");
        assert!(difference(&a, &bcast(0)).starts_with("different operations (allreduce and broadcast)"));
        let e = mismatch(&a, 0, &b, 1);
        assert_eq!(e.kind(), crate::error::ErrorKind::Mismatch);
        assert!(e.message().contains("rank 1 called allreduce of 200"), "{}", e.message());
        assert_eq!(e.failed_ranks(), &[1, 0]);
    }

    #[test]
    fn a_send_and_its_receive_share_a_fingerprint() {
        let send = of(&Op::Send { buf: Ptr::null(), count: 5, dt: DataType::Int32, peer: 1 });
        let recv = of(&Op::Recv { buf: Ptr::null(), count: 5, dt: DataType::Int32, peer: 0 });
        assert_eq!(send, recv);
    }
}
