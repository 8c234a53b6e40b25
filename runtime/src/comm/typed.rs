//! Safe, blocking conveniences over `submit` for Rust callers with typed slices (tools, benches,
//! tests): the borrow checker gives what `submit`'s `unsafe` asks of its caller.

use half::{bf16, f16};

use super::Communicator;
use crate::collectives::{Op, Ptr};
use crate::error::{Error, Result};
use crate::types::{DataType, ReduceOp};

/// A Rust type with an hccn data type.
pub trait Element: Copy {
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(impl Element for $t { const DTYPE: DataType = DataType::$d; })*};
}
element!(i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64, u8 => Uint8, u16 => Uint16, u32 => Uint32,
    u64 => Uint64, f16 => Fp16, bf16 => Bf16, f32 => Fp32, f64 => Fp64);

impl Communicator {
    /// Allreduce of `send` into `recv` (same length), complete on return.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        if send.len() != recv.len() {
            return Err(Error::invalid(format!("all_reduce: {} elements sent, {} received", send.len(), recv.len())));
        }
        let op = Op::AllReduce {
            send: Ptr::from_const(send.as_ptr()),
            recv: Ptr::from_mut(recv.as_mut_ptr()),
            count: send.len() as u64,
            dt: T::DTYPE,
            op,
        };
        // SAFETY: both slices are valid, distinct (one is borrowed mutably) and outlive this
        // blocking call, which is all `submit` asks.
        unsafe { self.submit(op, None) }
    }

    /// Barrier, complete on return.
    pub fn barrier(&self) -> Result<()> {
        // SAFETY: a barrier touches no buffer.
        unsafe { self.submit(Op::Barrier, None) }
    }
}
