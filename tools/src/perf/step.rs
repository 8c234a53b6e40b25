//! The buffers of one size step, out of place or in place, and the operation over them.

use std::sync::Arc;

use hccn_runtime::backend::{DeviceBuffer, DeviceMemory};
use hccn_runtime::mem::SharedBuf;
use hccn_runtime::{BackendComm, DataType, Op, Ptr, ReduceOp};

use super::check::Checker;
use super::coll::{Coll, Layout};

/// A buffer: on the native backend from the heap, or shareable memory (`-R`); on another
/// backend its device memory, filled and read through host copies.
enum Buf {
    Host(Box<dyn std::ops::DerefMut<Target = [u8]>>),
    Device(DeviceBuffer),
}

impl Buf {
    fn new(bytes: usize, device: Option<&Arc<dyn DeviceMemory>>, register: bool) -> Result<Buf, String> {
        Ok(match (device, register) {
            (Some(m), _) => Buf::Device(DeviceBuffer::new(m.clone(), bytes).map_err(|e| e.to_string())?),
            (None, true) => Buf::Host(Box::new(SharedBuf::new(bytes).map_err(|e| e.to_string())?)),
            (None, false) => Buf::Host(Box::new(vec![0u8; bytes])),
        })
    }

    /// The address `at` bytes into the buffer.
    fn ptr(&mut self, at: usize) -> Ptr {
        let base = match self {
            Buf::Host(b) => b.as_mut_ptr(),
            Buf::Device(d) => d.ptr().0,
        };
        Ptr(base.wrapping_add(at))
    }

    /// Writes this rank's input pattern into `range` (bytes); the rest of a device buffer is
    /// zeroed on the way.
    fn fill(&mut self, checker: &Checker, range: std::ops::Range<usize>) -> hccn_runtime::Result<()> {
        match self {
            Buf::Host(b) => checker.fill(&mut b[range]),
            Buf::Device(d) => {
                let mut host = vec![0u8; d.len()];
                checker.fill(&mut host[range]);
                d.upload(&host)?;
            }
        }
        Ok(())
    }

    fn wrong(&self, checker: &Checker, range: std::ops::Range<usize>, count: usize) -> hccn_runtime::Result<u64> {
        Ok(match self {
            Buf::Host(b) => checker.wrong(&b[range], count),
            Buf::Device(d) => {
                let mut host = vec![0u8; d.len()];
                d.download(&mut host)?;
                checker.wrong(&host[range], count)
            }
        })
    }
}

/// Where the operation's data is: separate buffers, or one buffer it reads and writes in place.
enum Bufs {
    Apart { send: Buf, recv: Buf },
    InPlace { buf: Buf, send_at: usize, recv_at: usize },
}

/// What one step runs: the collective, its data type, reduce op and root.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    pub coll: Coll,
    pub dt: DataType,
    pub op: ReduceOp,
    pub root: u32,
}

/// The buffers of one size step and the operation over them.
pub struct Step {
    bufs: Bufs,
    layout: Layout,
    kind: Kind,
    /// This rank and the world's size (sendrecv's peers).
    me: u32,
    n: u32,
}

impl Step {
    /// The buffers for `layout`; in place when `in_place` (the operation must have that form).
    pub fn new(
        kind: Kind,
        layout: Layout,
        (me, n): (u32, u32),
        in_place: bool,
        device: Option<&Arc<dyn DeviceMemory>>,
        register: bool,
    ) -> Result<Step, String> {
        let es = kind.dt.size();
        let bytes = |elems: u64| -> Result<usize, String> {
            usize::try_from(elems)
                .ok()
                .and_then(|e| e.checked_mul(es))
                .ok_or_else(|| format!("{} bytes do not fit in memory", layout.bytes))
        };
        let bufs = if in_place {
            let at = kind.coll.in_place(&layout, me).ok_or("no in-place form")?;
            let buf = Buf::new(bytes(at.elems)?, device, register)?;
            Bufs::InPlace { buf, send_at: bytes(at.send_at)?, recv_at: bytes(at.recv_at)? }
        } else {
            let send = Buf::new(bytes(layout.send_elems)?, device, register)?;
            Bufs::Apart { send, recv: Buf::new(bytes(layout.recv_elems)?, device, register)? }
        };
        Ok(Step { bufs, layout, kind, me, n })
    }

    fn bytes(&self, elems: u64) -> usize {
        elems as usize * self.kind.dt.size()
    }

    /// Writes this rank's input where the operation reads it (a broadcast's one buffer).
    pub fn fill(&mut self, checker: &Checker) -> hccn_runtime::Result<()> {
        let l = self.layout;
        let input = if self.kind.coll == Coll::Broadcast { l.recv_elems } else { l.send_elems };
        let len = self.bytes(input);
        match &mut self.bufs {
            Bufs::Apart { recv, .. } if self.kind.coll == Coll::Broadcast => recv.fill(checker, 0..len),
            Bufs::Apart { send, .. } => send.fill(checker, 0..len),
            Bufs::InPlace { buf, send_at, .. } if self.kind.coll != Coll::Broadcast => {
                buf.fill(checker, *send_at..*send_at + len)
            }
            Bufs::InPlace { buf, .. } => buf.fill(checker, 0..len),
        }
    }

    /// Wrong elements of this rank's result.
    pub fn wrong(&self, checker: &Checker) -> hccn_runtime::Result<u64> {
        let len = self.bytes(self.layout.recv_elems);
        let count = self.layout.count as usize;
        match &self.bufs {
            Bufs::Apart { recv, .. } => recv.wrong(checker, 0..len, count),
            Bufs::InPlace { buf, recv_at, .. } => buf.wrong(checker, *recv_at..*recv_at + len, count),
        }
    }

    /// Runs the operation once.
    pub fn run(&mut self, comm: &dyn BackendComm) -> hccn_runtime::Result<()> {
        let (send, recv) = match &mut self.bufs {
            Bufs::Apart { send, recv } => (send.ptr(0), recv.ptr(0)),
            Bufs::InPlace { buf, send_at, recv_at } => (buf.ptr(*send_at), buf.ptr(*recv_at)),
        };
        let Kind { coll, dt, op, root } = self.kind;
        let count = self.layout.count;
        let op = match coll {
            Coll::AllReduce => Op::AllReduce { send, recv, count, dt, op },
            Coll::Reduce => Op::Reduce { send, recv, count, dt, op, root },
            Coll::Broadcast => Op::Broadcast { buf: recv, count, dt, root },
            Coll::AllGather => Op::AllGather { send, recv, send_count: count, dt },
            Coll::ReduceScatter => Op::ReduceScatter { send, recv, recv_count: count, dt, op },
            Coll::AllToAll => Op::AllToAll { send, recv, count_per_rank: count, dt },
            Coll::Gather => Op::Gather { send, recv, send_count: count, dt, root },
            Coll::Scatter => Op::Scatter { send, recv, recv_count: count, dt, root },
            Coll::SendRecv => return self.send_recv(comm, send, recv),
        };
        // SAFETY: `send` and `recv` point into buffers owned by `self`, memory of the
        // communicator's backend, sized by `Coll::layout` (and `Coll::in_place`) for exactly
        // this op and count; they outlive the call, which blocks until done (no stream).
        unsafe { comm.submit(op, None) }
    }

    /// Sends to the next rank and receives from the previous one. hccn's send and receive are
    /// separate blocking calls, so even ranks send first and odd ranks receive first: no cycle
    /// of senders waits on itself.
    fn send_recv(&self, comm: &dyn BackendComm, send: Ptr, recv: Ptr) -> hccn_runtime::Result<()> {
        let (count, dt) = (self.layout.count, self.kind.dt);
        let to = Op::Send { buf: send, count, dt, peer: (self.me + 1) % self.n };
        let from = Op::Recv { buf: recv, count, dt, peer: (self.me + self.n - 1) % self.n };
        let order = if self.me.is_multiple_of(2) { [to, from] } else { [from, to] };
        for op in order {
            // SAFETY: as in `run`: both buffers hold `count` elements and outlive the call.
            unsafe { comm.submit(op, None)? };
        }
        Ok(())
    }
}
