//! Conversions between f32 working buffers and the 16-bit wire types of compressed collectives
//! (FP16, BF16). Rounding is to nearest, ties to even (IEEE 754), done by the `half` crate: its
//! slice conversions (vectorised where the CPU can, e.g. F16C) on aligned buffers, one element at
//! a time otherwise. Values beyond the wire type's range become ±infinity.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::{typed, typed_mut, Elem};
use crate::types::{DataType, ReduceOp};

/// A 16-bit float type that f32 data can travel as.
trait Half: Elem {
    fn narrow_one(x: f32) -> Self;
    fn widen_one(self) -> f32;
    fn narrow_slice(dst: &mut [Self], src: &[f32]);
    fn widen_slice(src: &[Self], dst: &mut [f32]);
}

macro_rules! half_wire {
    ($($t:ty),*) => {$(
        impl Half for $t {
            fn narrow_one(x: f32) -> Self {
                <$t>::from_f32(x)
            }
            fn widen_one(self) -> f32 {
                self.to_f32()
            }
            fn narrow_slice(dst: &mut [Self], src: &[f32]) {
                dst.convert_from_f32_slice(src)
            }
            fn widen_slice(src: &[Self], dst: &mut [f32]) {
                src.convert_to_f32_slice(dst)
            }
        }
    )*};
}
half_wire!(f16, bf16);

fn narrow_as<H: Half>(src: &[u8], dst: &mut [u8]) {
    if let (Some(s), Some(d)) = (typed::<f32>(src), typed_mut::<H>(dst)) {
        return H::narrow_slice(d, s);
    }
    for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(2)) {
        H::narrow_one(f32::load(s)).store(d);
    }
}

fn widen_as<H: Half>(src: &[u8], dst: &mut [u8]) {
    if let (Some(s), Some(d)) = (typed::<H>(src), typed_mut::<f32>(dst)) {
        return H::widen_slice(s, d);
    }
    for (s, d) in src.chunks_exact(2).zip(dst.chunks_exact_mut(4)) {
        H::load(s).widen_one().store(d);
    }
}

/// True for the wire types f32 data can be compressed to.
pub fn is_wire(wire: DataType) -> bool {
    matches!(wire, DataType::Fp16 | DataType::Bf16)
}

/// The f32 elements of `src` rounded to `wire` (FP16 or BF16): half as many bytes.
pub fn narrow(src: &[u8], wire: DataType) -> Vec<u8> {
    let mut out = vec![0u8; src.len() / 4 * 2];
    match wire {
        DataType::Bf16 => narrow_as::<bf16>(src, &mut out),
        _ => narrow_as::<f16>(src, &mut out),
    }
    out
}

/// Widens the `wire` elements of `src` into the f32 elements of `dst` (exact).
pub fn widen(src: &[u8], wire: DataType, dst: &mut [u8]) {
    match wire {
        DataType::Bf16 => widen_as::<bf16>(src, dst),
        _ => widen_as::<f16>(src, dst),
    }
}

/// Elements widened at a time by [`widen_reduce`]: 4 KiB of f32, which stay in L1 between
/// the conversion and the reduction.
const BLOCK: usize = 1024;

/// f32-aligned scratch, so that both passes take their typed (vectorised) path.
#[repr(align(16))]
struct Block([u8; BLOCK * 4]);

/// `dst[i] = dst[i] op widen(src[i])`, computed in f32 (AVG sums; see `finish_avg`).
pub fn widen_reduce(dst: &mut [u8], src: &[u8], wire: DataType, op: ReduceOp) {
    let mut wide = Block([0; BLOCK * 4]);
    for (d, s) in dst.chunks_mut(BLOCK * 4).zip(src.chunks(BLOCK * 2)) {
        let w = &mut wide.0[..s.len() * 2];
        widen(s, wire, w);
        super::reduce_into(d, w, DataType::Fp32, op);
    }
}

/// Rounds every f32 element of `buf` to the nearest `wire` value (kept as f32).
pub fn round_through(buf: &mut [u8], wire: DataType) {
    let w = narrow(buf, wire);
    widen(&w, wire, buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    fn f32s(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4).map(f32::load).collect()
    }

    #[test]
    fn rounds_to_nearest_even_and_saturates_to_infinity() {
        // 1 + 2^-11 is halfway between two FP16 values and rounds to even (1.0); 1 + 3*2^-11
        // rounds up. BF16 keeps 8 significand bits.
        let x = [1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), 70000.0, -0.0, 1.0 + 2f32.powi(-8)];
        let mut b = f32_bytes(&x);
        round_through(&mut b, DataType::Fp16);
        let got = f32s(&b);
        assert_eq!(&got[..2], &[1.0, 1.0 + 2f32.powi(-9)]);
        assert!(got[2].is_infinite() && got[2] > 0.0);
        assert!(got[3] == 0.0 && got[3].is_sign_negative());
        let mut b = f32_bytes(&x[4..]);
        round_through(&mut b, DataType::Bf16);
        assert_eq!(f32s(&b), vec![1.0]);
    }

    #[test]
    fn unaligned_buffers_give_the_same_bits() {
        let x: Vec<f32> = (0..101).map(|i| (i as f32 * 0.377).sin() * 1e3).collect();
        for wire in [DataType::Fp16, DataType::Bf16] {
            let aligned = narrow(&f32_bytes(&x), wire);
            let mut shifted = vec![0u8; x.len() * 4 + 1];
            shifted[1..].copy_from_slice(&f32_bytes(&x));
            assert_eq!(narrow(&shifted[1..], wire), aligned, "{wire:?}");
            let mut odd_src = vec![0u8; aligned.len() + 1];
            odd_src[1..].copy_from_slice(&aligned);
            let (mut a, mut u) = (vec![0u8; x.len() * 4], vec![0u8; x.len() * 4 + 3]);
            widen(&aligned, wire, &mut a);
            widen(&odd_src[1..], wire, &mut u[3..]);
            assert_eq!(&u[3..], &a[..], "{wire:?}");
        }
    }

    #[test]
    fn widen_reduce_accumulates_in_f32() {
        // 2048 + 1 is not an FP16 value, but the f32 accumulator holds it.
        let mut acc = f32_bytes(&[2048.0, 5.0]);
        widen_reduce(&mut acc, &narrow(&f32_bytes(&[1.0, 7.0]), DataType::Fp16), DataType::Fp16, ReduceOp::Sum);
        assert_eq!(f32s(&acc), vec![2049.0, 12.0]);
        widen_reduce(&mut acc, &narrow(&f32_bytes(&[4096.0, 3.0]), DataType::Bf16), DataType::Bf16, ReduceOp::Max);
        assert_eq!(f32s(&acc), vec![4096.0, 12.0]);
    }
}
