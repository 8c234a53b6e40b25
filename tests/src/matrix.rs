//! The collective matrix: every collective x data type x reduce op x count x root, with the
//! in-place forms, each checked against the exact fixture result. Every failure names rank,
//! operation, dtype, op, count and root.

use hccn_runtime::{DataType, Op, Ptr, ReduceOp};

use crate::fixture::{encode, fill, first_diff, input, reduced_block};
use crate::Coll;

/// Counts that cover the empty case, one element, odd sizes and several pipeline chunks (with
/// HCCN_CHUNK_BYTES=4096).
pub const COUNTS: [usize; 5] = [0, 1, 7, 1023, 4099];

/// Outcome of a run: checks made and failure descriptions.
#[derive(Debug, Default)]
pub struct Report {
    pub checks: usize,
    pub failures: Vec<String>,
}

impl Report {
    fn expect(&mut self, what: impl Fn() -> String, dt: DataType, got: &[u8], want: &[u8]) {
        self.checks += 1;
        if let Some(i) = first_diff(dt, got, want) {
            self.failures.push(format!("{}: first wrong element {i}", what()));
        }
    }

    fn call(&mut self, what: impl Fn() -> String, r: Result<(), (u32, String)>) -> bool {
        match r {
            Ok(()) => true,
            Err((code, msg)) => {
                self.checks += 1;
                self.failures.push(format!("{}: returned {code}: {msg}", what()));
                false
            }
        }
    }
}

/// Every `Op` built in this file points into live local buffers of the sizes the op uses.
fn exec(c: &dyn Coll, op: Op) -> Result<(), (u32, String)> {
    // SAFETY: see above; the call blocks until the operation is done.
    unsafe { c.run(op) }
}

fn roots(n: u32) -> Vec<u32> {
    let mut r = vec![0, n / 2, n - 1];
    r.dedup();
    r.sort_unstable();
    r.dedup();
    r
}

fn p(b: &[u8]) -> Ptr {
    Ptr::from_const(b.as_ptr())
}

fn pm(b: &mut [u8]) -> Ptr {
    Ptr::from_mut(b.as_mut_ptr())
}

const SENTINEL: u8 = 0x5a;

/// Runs the whole matrix on `c`; `dtypes` narrows it for quick runs.
pub fn run(c: &dyn Coll, dtypes: &[DataType], counts: &[usize]) -> Report {
    let mut rep = Report::default();
    for &dt in dtypes {
        for &count in counts {
            for op in ReduceOp::ALL {
                reductions(c, &mut rep, dt, op, count);
            }
            data_movement(c, &mut rep, dt, count);
        }
    }
    barrier(c, &mut rep);
    rep
}

fn reductions(c: &dyn Coll, rep: &mut Report, dt: DataType, op: ReduceOp, count: usize) {
    let (me, n) = (c.rank(), c.size());
    let all: Vec<u32> = (0..n).collect();
    let es = dt.size();
    let name = |what: &str, root: Option<u32>| {
        let what = what.to_owned();
        move || format!("rank {me}/{n}: {what} {} {} count {count} root {root:?}", dt.name(), op.name())
    };
    let cnt = count as u64;

    // allreduce, out of place and in place
    let send = fill(dt, op, me, 0, count);
    let want = reduced_block(dt, op, &all, 0, count);
    let mut recv = vec![SENTINEL; count * es];
    if rep.call(
        name("allreduce", None),
        exec(c, Op::AllReduce { send: p(&send), recv: pm(&mut recv), count: cnt, dt, op }),
    ) {
        rep.expect(name("allreduce", None), dt, &recv, &want);
    }
    let mut buf = send.clone();
    let bp = pm(&mut buf);
    if rep.call(name("allreduce in-place", None), exec(c, Op::AllReduce { send: bp, recv: bp, count: cnt, dt, op })) {
        rep.expect(name("allreduce in-place", None), dt, &buf, &want);
    }

    // reduce to every interesting root; in place on the root for root 0
    for root in roots(n) {
        let mut recv = vec![SENTINEL; count * es];
        let r = exec(c, Op::Reduce { send: p(&send), recv: pm(&mut recv), count: cnt, dt, op, root });
        if rep.call(name("reduce", Some(root)), r) && me == root {
            rep.expect(name("reduce", Some(root)), dt, &recv, &want);
        }
    }
    let mut buf = send.clone();
    let bp = pm(&mut buf);
    if rep
        .call(name("reduce in-place", Some(0)), exec(c, Op::Reduce { send: bp, recv: bp, count: cnt, dt, op, root: 0 }))
        && me == 0
    {
        rep.expect(name("reduce in-place", Some(0)), dt, &buf, &want);
    }

    // reduce_scatter: recvcount = count; rank r gets block r of the reduced n*count input
    let send = fill(dt, op, me, 0, count * n as usize);
    let want = reduced_block(dt, op, &all, me as usize * count, count);
    let mut recv = vec![SENTINEL; count * es];
    let r = exec(c, Op::ReduceScatter { send: p(&send), recv: pm(&mut recv), recv_count: cnt, dt, op });
    if rep.call(name("reduce_scatter", None), r) {
        rep.expect(name("reduce_scatter", None), dt, &recv, &want);
    }
    let mut buf = send.clone();
    let base = buf.as_mut_ptr();
    let r = exec(
        c,
        Op::ReduceScatter {
            send: Ptr(base),
            recv: Ptr(base.wrapping_add(me as usize * count * es)),
            recv_count: cnt,
            dt,
            op,
        },
    );
    if rep.call(name("reduce_scatter in-place", None), r) {
        let mine = &buf[me as usize * count * es..(me as usize + 1) * count * es];
        rep.expect(name("reduce_scatter in-place", None), dt, mine, &want);
    }
}

fn data_movement(c: &dyn Coll, rep: &mut Report, dt: DataType, count: usize) {
    let (me, n) = (c.rank(), c.size());
    let nu = n as usize;
    let es = dt.size();
    let cnt = count as u64;
    let name = |what: &str, root: Option<u32>| {
        let what = what.to_owned();
        move || format!("rank {me}/{n}: {what} {} count {count} root {root:?}", dt.name())
    };
    let sum = ReduceOp::Sum;
    let block_of = |r: u32| fill(dt, sum, r, 0, count);

    for root in roots(n) {
        // broadcast
        let mut buf = if me == root { block_of(root) } else { vec![SENTINEL; count * es] };
        if rep.call(name("broadcast", Some(root)), exec(c, Op::Broadcast { buf: pm(&mut buf), count: cnt, dt, root })) {
            rep.expect(name("broadcast", Some(root)), dt, &buf, &block_of(root));
        }
        // gather
        let send = block_of(me);
        let mut recv = vec![SENTINEL; count * es * nu];
        let r = exec(c, Op::Gather { send: p(&send), recv: pm(&mut recv), send_count: cnt, dt, root });
        if rep.call(name("gather", Some(root)), r) && me == root {
            let want: Vec<u8> = (0..n).flat_map(block_of).collect();
            rep.expect(name("gather", Some(root)), dt, &recv, &want);
        }
        // scatter: block p of the root's buffer goes to rank p
        // Non-roots pass a buffer the library must not read (poisoned with the sentinel).
        let send: Vec<u8> =
            if me == root { fill(dt, sum, root, 0, count * nu) } else { vec![SENTINEL; count * es * nu] };
        let mut recv = vec![SENTINEL; count * es];
        let r = exec(c, Op::Scatter { send: p(&send), recv: pm(&mut recv), recv_count: cnt, dt, root });
        if rep.call(name("scatter", Some(root)), r) {
            rep.expect(name("scatter", Some(root)), dt, &recv, &fill(dt, sum, root, me as usize * count, count));
        }
    }

    // allgather, out of place and in place
    let want: Vec<u8> = (0..n).flat_map(block_of).collect();
    let send = block_of(me);
    let mut recv = vec![SENTINEL; count * es * nu];
    if rep.call(
        name("allgather", None),
        exec(c, Op::AllGather { send: p(&send), recv: pm(&mut recv), send_count: cnt, dt }),
    ) {
        rep.expect(name("allgather", None), dt, &recv, &want);
    }
    let mut buf = vec![SENTINEL; count * es * nu];
    buf[me as usize * count * es..(me as usize + 1) * count * es].copy_from_slice(&send);
    let base = buf.as_mut_ptr();
    let r = exec(
        c,
        Op::AllGather { send: Ptr(base.wrapping_add(me as usize * count * es)), recv: Ptr(base), send_count: cnt, dt },
    );
    if rep.call(name("allgather in-place", None), r) {
        rep.expect(name("allgather in-place", None), dt, &buf, &want);
    }

    // allgatherv: rank i contributes count+i elements at a displacement leaving one-element gaps
    let counts: Vec<u64> = (0..n as u64).map(|i| cnt + i).collect();
    let displs: Vec<u64> = counts
        .iter()
        .scan(0u64, |acc, c| {
            let d = *acc;
            *acc += c + 1;
            Some(d)
        })
        .collect();
    let total = (displs[nu - 1] + counts[nu - 1]) as usize;
    let send = fill(dt, sum, me, 0, counts[me as usize] as usize);
    let mut recv = vec![SENTINEL; total * es];
    let r = exec(
        c,
        Op::AllGatherV {
            send: p(&send),
            send_count: counts[me as usize],
            recv: pm(&mut recv),
            recv_counts: counts.clone(),
            displs: displs.clone(),
            dt,
        },
    );
    if rep.call(name("allgatherv", None), r) {
        let mut want = vec![SENTINEL; total * es];
        for i in 0..nu {
            let at = displs[i] as usize * es;
            want[at..at + counts[i] as usize * es].copy_from_slice(&fill(dt, sum, i as u32, 0, counts[i] as usize));
        }
        rep.expect(name("allgatherv", None), dt, &recv, &want);
    }

    // alltoall: block p of rank r's input is fill(r, p*count ..)
    let send = fill(dt, sum, me, 0, count * nu);
    let mut recv = vec![SENTINEL; count * es * nu];
    let r = exec(c, Op::AllToAll { send: p(&send), recv: pm(&mut recv), count_per_rank: cnt, dt });
    if rep.call(name("alltoall", None), r) {
        let want: Vec<u8> = (0..n).flat_map(|q| fill(dt, sum, q, me as usize * count, count)).collect();
        rep.expect(name("alltoall", None), dt, &recv, &want);
    }

    // alltoallv: rank a sends (a+b)%3 + count/2 elements to b, values input(a, b*100000 + k)
    let len = |a: u32, b: u32| ((a + b) % 3) as usize + count / 2;
    let block = |a: u32, b: u32| -> Vec<u8> {
        (0..len(a, b)).flat_map(|k| encode(dt, input(dt, sum, a, b as usize * 100_000 + k))).collect()
    };
    let scounts: Vec<u64> = (0..n).map(|q| len(me, q) as u64).collect();
    let rcounts: Vec<u64> = (0..n).map(|q| len(q, me) as u64).collect();
    let prefix = |v: &[u64]| -> Vec<u64> {
        v.iter()
            .scan(0u64, |acc, c| {
                let d = *acc;
                *acc += c;
                Some(d)
            })
            .collect()
    };
    let (sdispls, rdispls) = (prefix(&scounts), prefix(&rcounts));
    let send: Vec<u8> = (0..n).flat_map(|q| block(me, q)).collect();
    let mut recv = vec![SENTINEL; rcounts.iter().sum::<u64>() as usize * es];
    let r = exec(
        c,
        Op::AllToAllV {
            send: p(&send),
            send_counts: scounts,
            send_displs: sdispls,
            recv: pm(&mut recv),
            recv_counts: rcounts,
            recv_displs: rdispls,
            dt,
        },
    );
    if rep.call(name("alltoallv", None), r) {
        let want: Vec<u8> = (0..n).flat_map(|q| block(q, me)).collect();
        rep.expect(name("alltoallv", None), dt, &recv, &want);
    }

    // send/recv around the ring (to itself on one rank): sends complete without the receive
    let to = (me + 1) % n;
    let from = (me + n - 1) % n;
    let send = block_of(me);
    let mut recv = vec![SENTINEL; count * es];
    let ok = rep.call(name("send", None), exec(c, Op::Send { buf: p(&send), count: cnt, dt, peer: to }))
        && rep.call(name("recv", None), exec(c, Op::Recv { buf: pm(&mut recv), count: cnt, dt, peer: from }));
    if ok {
        rep.expect(name("send/recv", None), dt, &recv, &block_of(from));
    }
}

fn barrier(c: &dyn Coll, rep: &mut Report) {
    let me = c.rank();
    // SAFETY: a barrier has no buffers.
    let r = exec(c, Op::Barrier);
    rep.call(|| format!("rank {me}: barrier"), r);
}
