//! The collectives hccn-perf times and their buffers, as nccl-tests lays them out: sizes, the
//! count column, bus bandwidth factors, and where the data sits in place.

/// The collectives hccn-perf can time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    Gather,
    Scatter,
    /// Each rank sends to rank + 1 and receives from rank - 1 (nccl-tests' sendrecv).
    SendRecv,
}

/// Buffer sizes of one step, in elements. `count` is the per-call count argument (per rank
/// for the ops that split by rank), as the count column of nccl-tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub count: u64,
    pub send_elems: u64,
    pub recv_elems: u64,
    /// The size column: bytes of the op's largest buffer.
    pub bytes: u64,
}

/// Where an in-place operation reads and writes within its one buffer (elements from its
/// start), as nccl-tests places them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InPlace {
    pub elems: u64,
    pub send_at: u64,
    pub recv_at: u64,
}

impl Coll {
    pub const ALL: [Coll; 9] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllToAll,
        Coll::Gather,
        Coll::Scatter,
        Coll::SendRecv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "allreduce",
            Coll::AllGather => "allgather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "alltoall",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::SendRecv => "sendrecv",
        }
    }

    pub fn from_name(name: &str) -> Option<Coll> {
        let squashed = name.to_ascii_lowercase().replace(['_', '-'], "");
        Coll::ALL.into_iter().find(|c| c.name().replace('_', "") == squashed)
    }

    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    pub fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter)
    }

    /// Whether the size is split among the ranks (count per rank).
    fn per_rank(self) -> bool {
        matches!(self, Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::Gather | Coll::Scatter)
    }

    /// The smallest size (bytes) that gives a step: one element, per rank where the op splits
    /// its buffer by rank.
    pub fn min_size(self, elem_size: u64, nranks: u32) -> u64 {
        if self.per_rank() {
            elem_size * u64::from(nranks)
        } else {
            elem_size
        }
    }

    /// busbw / algbw, as nccl-tests defines it.
    pub fn bus_factor(self, nranks: u32) -> f64 {
        let n = f64::from(nranks);
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::Gather | Coll::Scatter => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }

    /// Buffers for a step of `size` bytes, or `None` when that is less than one element (per
    /// rank, for the ops that split by rank).
    pub fn layout(self, size: u64, elem_size: u64, nranks: u32) -> Option<Layout> {
        let n = u64::from(nranks);
        let whole = size / elem_size;
        let (count, send, recv) = match self {
            Coll::AllReduce | Coll::Reduce | Coll::SendRecv => (whole, whole, whole),
            Coll::Broadcast => (whole, 0, whole),
            Coll::AllGather | Coll::Gather => (whole / n, whole / n, whole / n * n),
            Coll::ReduceScatter | Coll::Scatter => (whole / n, whole / n * n, whole / n),
            Coll::AllToAll => (whole / n, whole / n * n, whole / n * n),
        };
        (count > 0).then(|| Layout { count, send_elems: send, recv_elems: recv, bytes: send.max(recv) * elem_size })
    }

    /// Whether the operation has an out-of-place form (hccn's broadcast has one buffer only).
    pub fn out_of_place(self) -> bool {
        self != Coll::Broadcast
    }

    /// The in-place form of a step for rank `me`, or `None` where the operation has none
    /// (alltoall and sendrecv cannot read and write one buffer).
    pub fn in_place(self, l: &Layout, me: u32) -> Option<InPlace> {
        let mine = u64::from(me) * l.count;
        let (elems, send_at, recv_at) = match self {
            Coll::AllReduce | Coll::Reduce | Coll::Broadcast => (l.count, 0, 0),
            // The rank's own block of the gathered buffer is its input.
            Coll::AllGather | Coll::Gather => (l.recv_elems, mine, 0),
            // The rank's own block of the input is where its result goes.
            Coll::ReduceScatter | Coll::Scatter => (l.send_elems, 0, mine),
            Coll::AllToAll | Coll::SendRecv => return None,
        };
        Some(InPlace { elems, send_at, recv_at })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_follow_nccl_tests() {
        let l = |c: Coll, size| c.layout(size, 4, 4);
        assert_eq!(l(Coll::AllReduce, 100), Some(Layout { count: 25, send_elems: 25, recv_elems: 25, bytes: 100 }));
        assert_eq!(l(Coll::AllGather, 100), Some(Layout { count: 6, send_elems: 6, recv_elems: 24, bytes: 96 }));
        assert_eq!(l(Coll::Gather, 100), l(Coll::AllGather, 100));
        assert_eq!(l(Coll::ReduceScatter, 64), Some(Layout { count: 4, send_elems: 16, recv_elems: 4, bytes: 64 }));
        assert_eq!(l(Coll::Scatter, 64), l(Coll::ReduceScatter, 64));
        assert_eq!(l(Coll::AllToAll, 64), Some(Layout { count: 4, send_elems: 16, recv_elems: 16, bytes: 64 }));
        assert_eq!(l(Coll::Broadcast, 8), Some(Layout { count: 2, send_elems: 0, recv_elems: 2, bytes: 8 }));
        assert_eq!(l(Coll::SendRecv, 8), Some(Layout { count: 2, send_elems: 2, recv_elems: 2, bytes: 8 }));
        assert_eq!(l(Coll::AllGather, 8), None, "8 bytes is not one fp32 per rank of 4");
        assert_eq!(l(Coll::Reduce, 3), None);
        for c in Coll::ALL {
            let least = c.min_size(4, 3);
            assert!(c.layout(least, 4, 3).is_some() && c.layout(least - 1, 4, 3).is_none(), "{}", c.name());
            assert_eq!(Coll::from_name(c.name()), Some(c));
        }
        assert!((Coll::AllReduce.bus_factor(4) - 1.5).abs() < 1e-12);
        assert!((Coll::Scatter.bus_factor(4) - 0.75).abs() < 1e-12);
        assert!((Coll::SendRecv.bus_factor(4) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn in_place_positions_are_the_ranks_own_blocks() {
        let l = Coll::AllGather.layout(96, 4, 4).expect("layout");
        assert_eq!(Coll::AllGather.in_place(&l, 2), Some(InPlace { elems: 24, send_at: 12, recv_at: 0 }));
        let l = Coll::Scatter.layout(96, 4, 4).expect("layout");
        assert_eq!(Coll::Scatter.in_place(&l, 3), Some(InPlace { elems: 24, send_at: 0, recv_at: 18 }));
        let l = Coll::AllReduce.layout(96, 4, 4).expect("layout");
        assert_eq!(Coll::AllReduce.in_place(&l, 3), Some(InPlace { elems: 24, send_at: 0, recv_at: 0 }));
        assert_eq!(Coll::AllToAll.in_place(&l, 0), None);
        assert_eq!(Coll::SendRecv.in_place(&l, 0), None);
    }
}
