//! A bound on how far ranks run ahead in rooted collectives. In a reduce or gather the ranks that
//! only send return as soon as their data is on its way, and in a broadcast or scatter so does
//! the root: a loop of them lets the senders get ahead of the receivers without limit, and what
//! arrives early waits in the receiver's inbox (over TCP each link's reader thread takes it off
//! the socket). 4 ranks over TCP, 2,000 reduces of 1 MiB: 318 MiB of RSS on the root, growing
//! with the loop. So every RUNAHEAD_OPS rooted operations, or sooner once they moved
//! RUNAHEAD_BYTES, one of them ends with a barrier: no rank gets further ahead than that.
//!
//! The operations that settle are picked when they are submitted, from what every rank passes
//! alike (the kind and size of each rooted operation, in submit order), so every rank picks the
//! same ones; the barrier takes its own sequence number right after its operation's.

use std::sync::Mutex;

use super::Work;

/// Rooted operations between barriers: at 4 ranks over TCP a barrier costs about one small
/// reduce, so small rooted operations pay about 1/64 more.
const RUNAHEAD_OPS: u32 = 64;
/// Bytes of rooted operations (each counted at its largest buffer) between barriers: what a
/// sender can have waiting in a receiver's inbox, plus one operation. A barrier costs less than
/// 1 % of the time these bytes take.
const RUNAHEAD_BYTES: usize = 16 << 20;

#[derive(Default)]
pub(crate) struct RunAhead {
    /// Rooted operations and their bytes since the last barrier.
    since: Mutex<(u32, usize)>,
}

impl RunAhead {
    /// Whether `work`, submitted now on a communicator of `n` ranks, ends with a barrier.
    /// Call once per operation, in submit order.
    pub fn settles(&self, work: &Work, n: u32) -> bool {
        let bytes = match work {
            Work::Reduce { root: Some(_), bytes, .. } | Work::Broadcast { bytes, .. } => *bytes,
            Work::Gather { root: Some(_), send_bytes, .. } => send_bytes.saturating_mul(n as usize),
            Work::Scatter { recv_bytes, .. } => recv_bytes.saturating_mul(n as usize),
            _ => return false,
        };
        let mut since = self.since.lock().unwrap_or_else(|p| p.into_inner());
        since.0 += 1;
        since.1 = since.1.saturating_add(bytes);
        let settle = since.0 >= RUNAHEAD_OPS || since.1 >= RUNAHEAD_BYTES;
        if settle {
            *since = (0, 0);
        }
        settle
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::Ptr;

    fn reduce(bytes: usize, root: Option<u32>) -> Work {
        let (dt, op) = (crate::DataType::Fp32, crate::ReduceOp::Sum);
        Work::Reduce { send: Ptr::null(), recv: Ptr::null(), bytes, dt, op, root }
    }

    #[test]
    fn every_64th_small_rooted_operation_settles_and_allreduces_never_count() {
        let r = RunAhead::default();
        let settled: Vec<usize> = (1..=200)
            .filter(|_| {
                assert!(!r.settles(&reduce(4, None), 4), "an allreduce never settles");
                r.settles(&reduce(4, Some(0)), 4)
            })
            .collect();
        assert_eq!(settled, [64, 128, 192]);
    }

    #[test]
    fn large_rooted_operations_settle_once_they_moved_the_byte_bound() {
        let r = RunAhead::default();
        let bcast = Work::Broadcast { buf: Ptr::null(), bytes: 4 << 20, root: 1 };
        let settled: Vec<usize> = (1..=8).filter(|_| r.settles(&bcast, 4)).collect();
        assert_eq!(settled, [4, 8]);
        let gather = |send_bytes| Work::Gather {
            send: Ptr::null(),
            send_bytes,
            recv: Ptr::null(),
            blocks: Default::default(),
            root: Some(0),
        };
        assert!(!r.settles(&gather((4 << 20) - 1), 4));
        assert!(r.settles(&gather(1), 4), "4 ranks' blocks: 16 MiB");
    }
}
