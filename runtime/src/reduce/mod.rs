//! Element-wise reduction kernels over byte buffers, for every data type and op.
//!
//! Buffers come from users and from the wire, so they may be unaligned: aligned inputs take a
//! typed loop that the compiler vectorises, the rest an unaligned element loop. FP16 and BF16 are
//! computed in f32 and rounded once per step; integers wrap, as in NCCL.

pub mod narrow;

use half::{bf16, f16};

use crate::types::{DataType, ReduceOp};

/// A value the kernels can combine.
trait Elem: Copy + Send + Sync + 'static {
    const SIZE: usize;
    fn load(bytes: &[u8]) -> Self;
    fn store(self, bytes: &mut [u8]);
    fn combine(self, other: Self, op: ReduceOp) -> Self;
    /// Divides by the rank count for AVG (integers truncate toward zero).
    fn div_n(self, n: u32) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn load(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..Self::SIZE]);
                <$t>::from_ne_bytes(a)
            }
            #[inline(always)]
            fn store(self, b: &mut [u8]) {
                b[..Self::SIZE].copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn combine(self, o: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => self.wrapping_add(o),
                    ReduceOp::Prod => self.wrapping_mul(o),
                    ReduceOp::Max => self.max(o),
                    ReduceOp::Min => self.min(o),
                }
            }
            #[inline(always)]
            fn div_n(self, n: u32) -> Self {
                // n <= u32::MAX fits every type we divide in i128 without loss.
                ((self as i128) / (n as i128)) as $t
            }
        }
    )*};
}
int_elem!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn load(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..Self::SIZE]);
                <$t>::from_ne_bytes(a)
            }
            #[inline(always)]
            fn store(self, b: &mut [u8]) {
                b[..Self::SIZE].copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn combine(self, o: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => self + o,
                    ReduceOp::Prod => self * o,
                    ReduceOp::Max => self.max(o),
                    ReduceOp::Min => self.min(o),
                }
            }
            #[inline(always)]
            fn div_n(self, n: u32) -> Self {
                self / (n as $t)
            }
        }
    )*};
}
float_elem!(f32, f64);

macro_rules! half_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = 2;
            #[inline(always)]
            fn load(b: &[u8]) -> Self {
                <$t>::from_bits(u16::from_ne_bytes([b[0], b[1]]))
            }
            #[inline(always)]
            fn store(self, b: &mut [u8]) {
                b[..2].copy_from_slice(&self.to_bits().to_ne_bytes());
            }
            #[inline(always)]
            fn combine(self, o: Self, op: ReduceOp) -> Self {
                <$t>::from_f32(self.to_f32().combine(o.to_f32(), op))
            }
            #[inline(always)]
            fn div_n(self, n: u32) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
        }
    )*};
}
half_elem!(f16, bf16);

/// Reinterprets `bytes` as `[T]` when it is aligned for `T`.
fn typed<T: Elem>(bytes: &[u8]) -> Option<&[T]> {
    if bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
        return None;
    }
    // SAFETY: aligned, length rounded down to whole elements, and every bit pattern is a valid T
    // (all Elem types are plain integers or IEEE floats).
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / T::SIZE) })
}

fn typed_mut<T: Elem>(bytes: &mut [u8]) -> Option<&mut [T]> {
    if bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
        return None;
    }
    // SAFETY: as in `typed`, and the exclusive borrow of `bytes` is moved into the result.
    Some(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), bytes.len() / T::SIZE) })
}

fn combine_into<T: Elem>(dst: &mut [u8], src: &[u8], op: ReduceOp) {
    if let (Some(s), Some(d)) = (typed::<T>(src), typed_mut::<T>(dst)) {
        // One loop per op so that each body is a plain vectorisable expression.
        match op {
            ReduceOp::Sum | ReduceOp::Avg => d.iter_mut().zip(s).for_each(|(d, s)| *d = d.combine(*s, ReduceOp::Sum)),
            ReduceOp::Prod => d.iter_mut().zip(s).for_each(|(d, s)| *d = d.combine(*s, ReduceOp::Prod)),
            ReduceOp::Max => d.iter_mut().zip(s).for_each(|(d, s)| *d = d.combine(*s, ReduceOp::Max)),
            ReduceOp::Min => d.iter_mut().zip(s).for_each(|(d, s)| *d = d.combine(*s, ReduceOp::Min)),
        }
        return;
    }
    for (d, s) in dst.chunks_exact_mut(T::SIZE).zip(src.chunks_exact(T::SIZE)) {
        T::load(d).combine(T::load(s), op).store(d);
    }
}

fn div_all<T: Elem>(buf: &mut [u8], n: u32) {
    for d in buf.chunks_exact_mut(T::SIZE) {
        T::load(d).div_n(n).store(d);
    }
}

macro_rules! dispatch {
    ($dt:expr, $f:ident ( $($arg:expr),* )) => {
        match $dt {
            DataType::Int8 => $f::<i8>($($arg),*),
            DataType::Int16 => $f::<i16>($($arg),*),
            DataType::Int32 => $f::<i32>($($arg),*),
            DataType::Int64 => $f::<i64>($($arg),*),
            DataType::Uint8 => $f::<u8>($($arg),*),
            DataType::Uint16 => $f::<u16>($($arg),*),
            DataType::Uint32 => $f::<u32>($($arg),*),
            DataType::Uint64 => $f::<u64>($($arg),*),
            DataType::Fp16 => $f::<f16>($($arg),*),
            DataType::Bf16 => $f::<bf16>($($arg),*),
            DataType::Fp32 => $f::<f32>($($arg),*),
            DataType::Fp64 => $f::<f64>($($arg),*),
        }
    };
}

/// `dst[i] = dst[i] op src[i]` for every whole element of the shorter buffer. AVG sums here;
/// [`finish_avg`] divides once at the end.
pub fn reduce_into(dst: &mut [u8], src: &[u8], dt: DataType, op: ReduceOp) {
    let n = dst.len().min(src.len());
    dispatch!(dt, combine_into(&mut dst[..n], &src[..n], op))
}

/// Completes an AVG: divides every element of `buf` by `nranks`.
pub fn finish_avg(buf: &mut [u8], dt: DataType, nranks: u32) {
    dispatch!(dt, div_all(buf, nranks))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T: Elem>(v: &[T]) -> Vec<u8> {
        let mut out = vec![0u8; v.len() * T::SIZE];
        for (x, b) in v.iter().zip(out.chunks_exact_mut(T::SIZE)) {
            x.store(b);
        }
        out
    }

    #[test]
    fn int_ops_wrap_and_avg_truncates_toward_zero() {
        let mut d = bytes_of::<i8>(&[100, -7, 3, -128]);
        reduce_into(&mut d, &bytes_of::<i8>(&[100, 2, -9, -1]), DataType::Int8, ReduceOp::Sum);
        assert_eq!(d, bytes_of::<i8>(&[-56, -5, -6, 127]));
        let mut d = bytes_of::<i32>(&[-7, 7, -1]);
        finish_avg(&mut d, DataType::Int32, 2);
        assert_eq!(d, bytes_of::<i32>(&[-3, 3, 0]));
    }

    #[test]
    fn half_types_compute_in_f32() {
        let a = [f16::from_f32(1.5), f16::from_f32(-2.0)];
        let b = [f16::from_f32(2.25), f16::from_f32(8.0)];
        for (op, want) in [(ReduceOp::Sum, [3.75, 6.0]), (ReduceOp::Max, [2.25, 8.0]), (ReduceOp::Prod, [3.375, -16.0])]
        {
            let mut d = bytes_of(&a);
            reduce_into(&mut d, &bytes_of(&b), DataType::Fp16, op);
            assert_eq!(d, bytes_of(&want.map(f16::from_f32)), "{op:?}");
        }
        let mut d = bytes_of(&[bf16::from_f32(3.0)]);
        finish_avg(&mut d, DataType::Bf16, 2);
        assert_eq!(d, bytes_of(&[bf16::from_f32(1.5)]));
    }

    #[test]
    fn unaligned_buffers_give_the_same_result() {
        let a: Vec<f64> = (0..37).map(|i| i as f64 * 0.5).collect();
        let b: Vec<f64> = (0..37).map(|i| 100.0 - i as f64).collect();
        let mut aligned = bytes_of(&a);
        reduce_into(&mut aligned, &bytes_of(&b), DataType::Fp64, ReduceOp::Min);
        let mut shifted = vec![0u8; aligned.len() + 1];
        shifted[1..].copy_from_slice(&bytes_of(&a));
        let mut src = vec![0u8; aligned.len() + 3];
        src[3..].copy_from_slice(&bytes_of(&b));
        reduce_into(&mut shifted[1..], &src[3..], DataType::Fp64, ReduceOp::Min);
        assert_eq!(&shifted[1..], &aligned[..]);
    }
}
