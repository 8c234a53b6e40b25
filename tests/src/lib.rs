//! Shared pieces of hccn's multi-process tests: exact fixtures, the collective matrix, and the
//! two ways of running it (the runtime directly, or the C ABI).

pub mod capi;
pub mod etcd;
pub mod fixture;
pub mod framework;
pub mod launch;
pub mod matrix;
pub mod netlab;
pub mod scratch;
pub mod slurm;
pub mod threads;
pub mod torch;

use hccn_runtime::Op;

/// Something that runs one operation and blocks until it is done.
pub trait Coll {
    fn rank(&self) -> u32;
    fn size(&self) -> u32;
    /// Runs `op` to completion; `Err` carries the result code and message.
    ///
    /// # Safety
    /// The buffers of `op` must be valid for the operation, as for `Communicator::submit`.
    unsafe fn run(&self, op: Op) -> Result<(), (u32, String)>;
}

/// The runtime's communicator, driven directly.
impl Coll for hccn_runtime::Communicator {
    fn rank(&self) -> u32 {
        hccn_runtime::Communicator::rank(self)
    }
    fn size(&self) -> u32 {
        hccn_runtime::Communicator::size(self)
    }
    unsafe fn run(&self, op: Op) -> Result<(), (u32, String)> {
        // SAFETY: forwarded from the caller.
        unsafe { self.submit(op, None) }.map_err(|e| (hccn::result_of(e.kind()), e.to_string()))
    }
}
