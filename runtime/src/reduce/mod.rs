//! Element-wise reduction kernels over byte buffers, for every data type and op.
//!
//! Buffers come from users and from the wire, so they may be unaligned: every kernel is one
//! loop of unaligned loads and stores with the op fixed at compile time, which the compiler
//! vectorises; it is compiled three times (baseline x86-64, AVX2, AVX-512) and the widest the CPU
//! has is picked at run time. FP16 and BF16 go through f32 in blocks that stay in L1: widened
//! (F16C for FP16 through the `half` crate, a shift for BF16), combined in f32, rounded back once
//! per step (to nearest even), exactly as an element-at-a-time f32 computation would. Integers
//! wrap, as in NCCL; float MAX and MIN return the other operand when one is NaN (IEEE maxNum,
//! Rust's `f32::max`). No kernel branches per element on anything but the values themselves.

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

/// The instruction sets a kernel can be compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Baseline,
    Avx2,
    Avx512,
}

/// The widest instruction set this CPU runs (detected once; the check is a cached load).
pub fn isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
        {
            return Isa::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return Isa::Avx2;
        }
    }
    Isa::Baseline
}

/// Bytes per cache line on every x86-64 and Arm server core we run on.
const CACHE_LINE: usize = 64;

/// `d[i] = f(a[i], b[i])` for `i < n`: the one loop every kernel is made of, in place
/// (`a == d`) or from two sources into a third buffer (an out-of-place reduction reads each
/// operand once and writes the result once, with no copy first).
///
/// # Safety
/// `d` valid for writes and `a`, `b` for reads of `n` elements of `T` (any alignment); `a` may
/// be `d`, otherwise no two of them overlap.
#[inline(always)]
unsafe fn zip_apply<T: Copy, F: Fn(T, T) -> T>(d: *mut T, a: *const T, b: *const T, n: usize, f: F) {
    if a == d.cast_const() {
        // One pointer for the load and the store: the vectoriser sees that they never overlap
        // across iterations (given two, its run-time overlap check would fail and fall back to
        // the scalar loop).
        // SAFETY: passed on.
        unsafe { zip_loop(d, d, b, n, f) }
    } else {
        // SAFETY: passed on.
        unsafe { zip_loop(d, a, b, n, f) }
    }
}

/// The loop of [`zip_apply`].
///
/// # Safety
/// As [`zip_apply`].
#[inline(always)]
unsafe fn zip_loop<T: Copy, F: Fn(T, T) -> T>(d: *mut T, a: *const T, b: *const T, n: usize, f: F) {
    // Elements before `d` reaches a cache-line boundary go one at a time: a vector store that
    // straddles two lines costs two (malloc's large blocks start 16 bytes past a page).
    let size = std::mem::size_of::<T>();
    let misaligned = d as usize % CACHE_LINE;
    let head = if misaligned.is_multiple_of(size) { ((CACHE_LINE - misaligned) % CACHE_LINE / size).min(n) } else { 0 };
    for i in 0..head {
        // SAFETY: i < head <= n, within every buffer per the caller.
        unsafe { d.add(i).write_unaligned(f(a.add(i).read_unaligned(), b.add(i).read_unaligned())) }
    }
    // SAFETY: head <= n, so the rest lies within every buffer.
    let (d, a, b, n) = unsafe { (d.add(head), a.add(head), b.add(head), n - head) };
    for i in 0..n {
        // SAFETY: i < n, within every buffer per the caller.
        unsafe { d.add(i).write_unaligned(f(a.add(i).read_unaligned(), b.add(i).read_unaligned())) }
    }
}

/// The same loop compiled for AVX2.
///
/// # Safety
/// As [`zip_apply`], and the CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn zip_apply_avx2<T: Copy, F: Fn(T, T) -> T>(d: *mut T, a: *const T, b: *const T, n: usize, f: F) {
    // SAFETY: passed on.
    unsafe { zip_apply(d, a, b, n, f) }
}

/// The same loop compiled for AVX-512 (F, BW, DQ).
///
/// # Safety
/// As [`zip_apply`], and the CPU must have AVX-512 F, BW and DQ.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
unsafe fn zip_apply_avx512<T: Copy, F: Fn(T, T) -> T>(d: *mut T, a: *const T, b: *const T, n: usize, f: F) {
    // SAFETY: passed on.
    unsafe { zip_apply(d, a, b, n, f) }
}

/// Runs `f` over `n` element pairs with the widest instruction set available.
///
/// # Safety
/// As [`zip_apply`].
#[inline(always)]
unsafe fn zip_dispatch<T: Copy, F: Fn(T, T) -> T>(d: *mut T, a: *const T, b: *const T, n: usize, f: F) {
    match isa() {
        // SAFETY: the CPU has the features (checked by `isa`); buffers per the caller.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { zip_apply_avx512(d, a, b, n, f) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { zip_apply_avx2(d, a, b, n, f) },
        // SAFETY: buffers per the caller.
        _ => unsafe { zip_apply(d, a, b, n, f) },
    }
}

/// The element pointers of `dst = a op b` (`a = None`: in place, `dst op= b`) and how many
/// whole elements of size `size` all of them hold.
fn operands(dst: &mut [u8], a: Option<&[u8]>, b: &[u8], size: usize) -> (*mut u8, *const u8, *const u8, usize) {
    let n = dst.len().min(b.len()).min(a.map_or(usize::MAX, <[u8]>::len)) / size;
    let d = dst.as_mut_ptr();
    (d, a.map_or(d.cast_const(), <[u8]>::as_ptr), b.as_ptr(), n)
}

/// `dst = a op b` (`a = None`: `dst op= b`) over whole elements of plain (non-16-bit-float)
/// types, one loop per op so that the op is a constant inside it.
fn combine_plain<T: Elem>(dst: &mut [u8], a: Option<&[u8]>, b: &[u8], op: ReduceOp) {
    let (d, a, b, n) = operands(dst, a, b, T::SIZE);
    let (d, a, b) = (d.cast::<T>(), a.cast::<T>(), b.cast::<T>());
    // SAFETY: `n` whole elements fit in every buffer; `dst` is exclusively borrowed, so neither
    // source overlaps it unless `a` is `dst` itself; loads and stores are unaligned.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => zip_dispatch(d, a, b, n, |x: T, y| x.combine(y, ReduceOp::Sum)),
            ReduceOp::Prod => zip_dispatch(d, a, b, n, |x: T, y| x.combine(y, ReduceOp::Prod)),
            ReduceOp::Max => zip_dispatch(d, a, b, n, |x: T, y| x.combine(y, ReduceOp::Max)),
            ReduceOp::Min => zip_dispatch(d, a, b, n, |x: T, y| x.combine(y, ReduceOp::Min)),
        }
    }
}

/// BF16 bits to f32 (exact).
#[inline(always)]
fn bf16_widen(x: u16) -> f32 {
    f32::from_bits(u32::from(x) << 16)
}

/// f32 bits to BF16 bits, to nearest even, NaN kept quiet: `half`'s `bf16::from_f32` without
/// branches (selects), so that it vectorises.
#[inline(always)]
fn bf16_round(x: u32) -> u16 {
    let nan = ((x >> 16) | 0x0040) as u16;
    let up = (x & 0x8000) != 0 && (x & 0x17fff) != 0;
    let rounded = ((x >> 16) + u32::from(up)) as u16;
    if x & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    }
}

/// `dst = a op b` (`a = None`: `dst op= b`) for BF16 in f32: widen both, combine, round once,
/// in one vectorised loop.
fn combine_bf16(dst: &mut [u8], a: Option<&[u8]>, b: &[u8], op: ReduceOp) {
    let (d, a, b, n) = operands(dst, a, b, 2);
    let (d, a, b) = (d.cast::<u16>(), a.cast::<u16>(), b.cast::<u16>());
    let f = |x: u16, y: u16, g: fn(f32, f32) -> f32| bf16_round(g(bf16_widen(x), bf16_widen(y)).to_bits());
    // SAFETY: as in `combine_plain`.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => zip_dispatch(d, a, b, n, |x, y| f(x, y, |x, y| x + y)),
            ReduceOp::Prod => zip_dispatch(d, a, b, n, |x, y| f(x, y, |x, y| x * y)),
            ReduceOp::Max => zip_dispatch(d, a, b, n, |x, y| f(x, y, f32::max)),
            ReduceOp::Min => zip_dispatch(d, a, b, n, |x, y| f(x, y, f32::min)),
        }
    }
}

/// `dst op= src` for FP16 in f32: with F16C, 8 elements at a time through the conversion
/// instructions; otherwise (and for the tail) one at a time through `half` (same rounding).
fn combine_f16(dst: &mut [u8], src: &[u8], op: ReduceOp) {
    let n = dst.len().min(src.len()) / 2;
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if isa() != Isa::Baseline && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has AVX2 and F16C; `n` elements fit in both buffers.
        done = unsafe { f16c::combine(dst.as_mut_ptr(), src.as_ptr(), n, op) };
    }
    scalar_into::<f16>(&mut dst[done * 2..n * 2], &src[done * 2..n * 2], op);
}

#[cfg(target_arch = "x86_64")]
mod f16c {
    use std::arch::x86_64::*;

    use crate::types::ReduceOp;

    /// The loop over whole groups of 8; returns how many elements it combined.
    ///
    /// # Safety
    /// As [`combine`]; only called from there (so compiled with its features).
    #[inline(always)]
    unsafe fn run<F: Fn(__m256, __m256) -> __m256>(d: *mut u8, s: *const u8, n: usize, f: F) -> usize {
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: 8 elements (16 bytes) at element i are within both buffers; the caller
            // runs with AVX2 and F16C.
            unsafe {
                let pd = d.add(2 * i).cast::<__m128i>();
                let a = _mm256_cvtph_ps(_mm_loadu_si128(pd));
                let b = _mm256_cvtph_ps(_mm_loadu_si128(s.add(2 * i).cast::<__m128i>()));
                _mm_storeu_si128(pd, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(f(a, b)));
            }
            i += 8;
        }
        i
    }

    /// Combines the first multiple of 8 of `n` FP16 elements in f32; returns how many it did.
    /// MAX and MIN follow `f32::max` and `f32::min`: a NaN operand yields the other one.
    ///
    /// # Safety
    /// AVX2 and F16C; `d` and `s` valid for `n` 16-bit elements (any alignment), not overlapping.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn combine(d: *mut u8, s: *const u8, n: usize, op: ReduceOp) -> usize {
        let nan_safe = |r: __m256, a: __m256, b: __m256| {
            let r = _mm256_blendv_ps(r, b, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a));
            _mm256_blendv_ps(r, a, _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b))
        };
        // SAFETY: passed on from the caller.
        unsafe {
            match op {
                ReduceOp::Sum | ReduceOp::Avg => run(d, s, n, |a, b| _mm256_add_ps(a, b)),
                ReduceOp::Prod => run(d, s, n, |a, b| _mm256_mul_ps(a, b)),
                ReduceOp::Max => run(d, s, n, |a, b| nan_safe(_mm256_max_ps(b, a), a, b)),
                ReduceOp::Min => run(d, s, n, |a, b| nan_safe(_mm256_min_ps(b, a), a, b)),
            }
        }
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
    combine(dst, None, src, dt, op)
}

/// `dst = a op b`, or with `a = None` `dst op= b`, for every whole element of the shortest.
fn combine(dst: &mut [u8], a: Option<&[u8]>, b: &[u8], dt: DataType, op: ReduceOp) {
    match dt {
        DataType::Int8 => combine_plain::<i8>(dst, a, b, op),
        DataType::Int16 => combine_plain::<i16>(dst, a, b, op),
        DataType::Int32 => combine_plain::<i32>(dst, a, b, op),
        DataType::Int64 => combine_plain::<i64>(dst, a, b, op),
        DataType::Uint8 => combine_plain::<u8>(dst, a, b, op),
        DataType::Uint16 => combine_plain::<u16>(dst, a, b, op),
        DataType::Uint32 => combine_plain::<u32>(dst, a, b, op),
        DataType::Uint64 => combine_plain::<u64>(dst, a, b, op),
        DataType::Fp32 => combine_plain::<f32>(dst, a, b, op),
        DataType::Fp64 => combine_plain::<f64>(dst, a, b, op),
        DataType::Bf16 => combine_bf16(dst, a, b, op),
        DataType::Fp16 => match a {
            None => combine_f16(dst, b, op),
            // The F16C loop works in place: each block of `a` is copied into `dst` and combined
            // while it is in L1.
            Some(a) => {
                let n = dst.len().min(a.len()).min(b.len()) / 2 * 2;
                let blocks =
                    dst[..n].chunks_mut(FROM_BLOCK).zip(a[..n].chunks(FROM_BLOCK)).zip(b[..n].chunks(FROM_BLOCK));
                for ((d, a), b) in blocks {
                    d.copy_from_slice(a);
                    combine_f16(d, b, op);
                }
            }
        },
    }
}

/// Bytes per block of the FP16 [`reduce_from`] and of [`reduce_onto`]: small enough to stay in
/// L1, a multiple of every element size.
const FROM_BLOCK: usize = 8 << 10;

/// `dst[i] = a[i] op b[i]` for every whole element of the shortest buffer: the same bits as
/// copying `a` into `dst` then [`reduce_into`] with `b`, in one pass that reads each operand
/// once (an out-of-place allreduce combines the caller's input with what arrives straight into
/// the output).
pub fn reduce_from(dst: &mut [u8], a: &[u8], b: &[u8], dt: DataType, op: ReduceOp) {
    combine(dst, Some(a), b, dt, op)
}

/// `dst[i] = base[i] op dst[i]` for every whole element of the shorter buffer: for a received
/// buffer that landed in `dst` and must be combined with this rank's `base` as [`reduce_from`]
/// does. Sums and products commute (up to a NaN's payload, which the compiler does not keep
/// either); float MAX and MIN keep the operand order, which decides the sign of a zero.
pub fn reduce_onto(dst: &mut [u8], base: &[u8], dt: DataType, op: ReduceOp) {
    if !(dt.is_float() && matches!(op, ReduceOp::Max | ReduceOp::Min)) {
        return reduce_into(dst, base, dt, op);
    }
    // Set dst's block aside in L1, put `base` in its place and combine.
    let mut kept = [0u8; FROM_BLOCK];
    for (d, b) in dst.chunks_mut(FROM_BLOCK).zip(base.chunks(FROM_BLOCK)) {
        let n = d.len().min(b.len());
        kept[..n].copy_from_slice(&d[..n]);
        d[..n].copy_from_slice(&b[..n]);
        reduce_into(&mut d[..n], &kept[..n], dt, op);
    }
}

/// The element-at-a-time reference the kernels must match bit for bit (tests and the kernel
/// benchmark check against it).
pub fn reduce_into_scalar(dst: &mut [u8], src: &[u8], dt: DataType, op: ReduceOp) {
    let n = dst.len().min(src.len());
    dispatch!(dt, scalar_into(&mut dst[..n], &src[..n], op))
}

fn scalar_into<T: Elem>(dst: &mut [u8], src: &[u8], op: ReduceOp) {
    for (d, s) in dst.chunks_exact_mut(T::SIZE).zip(src.chunks_exact(T::SIZE)) {
        T::load(d).combine(T::load(s), op).store(d);
    }
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

    /// Deterministic bytes with a good share of special float values (NaN, ±inf, ±0, extremes).
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(&x.to_ne_bytes());
        }
        out.truncate(len);
        out
    }

    fn specials(dt: DataType) -> Vec<u8> {
        let mut v = Vec::new();
        match dt {
            DataType::Fp32 => {
                for x in
                    [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, f32::MAX, f32::MIN_POSITIVE, 1.5]
                {
                    v.extend_from_slice(&x.to_ne_bytes());
                }
            }
            DataType::Fp64 => {
                for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, f64::MAX, -2.5] {
                    v.extend_from_slice(&x.to_ne_bytes());
                }
            }
            DataType::Fp16 => {
                for x in [
                    f16::NAN,
                    f16::INFINITY,
                    f16::NEG_INFINITY,
                    f16::ZERO,
                    f16::NEG_ZERO,
                    f16::MAX,
                    f16::from_f32(1e-7),
                ] {
                    v.extend_from_slice(&x.to_bits().to_ne_bytes());
                }
            }
            DataType::Bf16 => {
                for x in [bf16::NAN, bf16::INFINITY, bf16::NEG_INFINITY, bf16::ZERO, bf16::NEG_ZERO, bf16::MAX] {
                    v.extend_from_slice(&x.to_bits().to_ne_bytes());
                }
            }
            _ => {}
        }
        v
    }

    /// Equal, with every NaN equal to every NaN (payloads may differ between F16C and software).
    /// Under Miri, +0 and -0 are equal too: `f32::max(-0.0, 0.0)` may return either zero, and
    /// Miri picks at random where hardware is deterministic.
    fn same(dt: DataType, a: &[u8], b: &[u8]) -> bool {
        let es = dt.size();
        a.len() == b.len()
            && a.chunks_exact(es).zip(b.chunks_exact(es)).all(|(x, y)| {
                let nan = |e: &[u8]| match dt {
                    DataType::Fp32 => f32::load(e).is_nan(),
                    DataType::Fp64 => f64::load(e).is_nan(),
                    DataType::Fp16 => f16::load(e).is_nan(),
                    DataType::Bf16 => bf16::load(e).is_nan(),
                    _ => false,
                };
                let zero = |e: &[u8]| match dt {
                    DataType::Fp32 => f32::load(e) == 0.0,
                    DataType::Fp64 => f64::load(e) == 0.0,
                    DataType::Fp16 => f16::load(e).to_f32() == 0.0,
                    DataType::Bf16 => bf16::load(e).to_f32() == 0.0,
                    _ => false,
                };
                x == y || (nan(x) && nan(y)) || (cfg!(miri) && zero(x) && zero(y))
            })
    }

    #[test]
    #[cfg_attr(miri, ignore = "exhaustive: hours under Miri; the natively run suite covers it")]
    fn kernels_in_and_out_of_place_match_the_scalar_reference_for_every_type_op_length_and_alignment() {
        for dt in DataType::ALL {
            let es = dt.size();
            for op in ReduceOp::ALL {
                for (k, len) in (0..70).chain([511, 512, 513, 1025, 4099]).enumerate() {
                    for (oa, ob) in [(0, 0), (1, 3), (es.min(2), 0)] {
                        let mut a = noise(len * es + oa, (k * 31 + oa) as u64);
                        let mut b = noise(len * es + ob, (k * 17 + ob + 7) as u64);
                        // Sprinkle the special values at the start and the end.
                        let sp = specials(dt);
                        for (buf, off) in [(&mut a, oa), (&mut b, ob)] {
                            let n = sp.len().min(buf.len() - off);
                            buf[off..off + n].copy_from_slice(&sp[..n]);
                            let tail = buf.len().saturating_sub(n).max(off);
                            let m = buf.len() - tail;
                            buf[tail..].copy_from_slice(&sp[sp.len() - m.min(sp.len())..][..m.min(sp.len())]);
                        }
                        let mut want = a[oa..].to_vec();
                        reduce_into_scalar(&mut want, &b[ob..], dt, op);
                        // Out of place, into a third buffer at yet another offset.
                        let od = (oa + ob + 1) % 4;
                        let mut from = vec![0xa5u8; len * es + od];
                        reduce_from(&mut from[od..], &a[oa..], &b[ob..], dt, op);
                        assert!(same(dt, &from[od..], &want), "from: {dt:?} {op:?} len {len} offsets {oa},{ob},{od}");
                        reduce_into(&mut a[oa..], &b[ob..], dt, op);
                        assert!(same(dt, &a[oa..], &want), "{dt:?} {op:?} len {len} offsets {oa},{ob}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_pair_of_special_values_matches_the_reference() {
        for dt in [DataType::Fp32, DataType::Fp64, DataType::Fp16, DataType::Bf16] {
            let es = dt.size();
            let sp = specials(dt);
            let k = sp.len() / es;
            // Each special against each special, repeated so the vector loop sees them all.
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..9 {
                for i in 0..k {
                    for j in 0..k {
                        a.extend_from_slice(&sp[i * es..(i + 1) * es]);
                        b.extend_from_slice(&sp[j * es..(j + 1) * es]);
                    }
                }
            }
            for op in ReduceOp::ALL {
                let mut want = a.clone();
                reduce_into_scalar(&mut want, &b, dt, op);
                let mut got = a.clone();
                reduce_into(&mut got, &b, dt, op);
                let es = dt.size();
                let bad = (0..got.len() / es).find(|&i| !same(dt, &got[i * es..][..es], &want[i * es..][..es]));
                assert!(
                    bad.is_none(),
                    "{dt:?} {op:?}: element {bad:?}: a {:?} b {:?} got {:?} want {:?}",
                    bad.map(|i| &a[i * es..][..es]),
                    bad.map(|i| &b[i * es..][..es]),
                    bad.map(|i| &got[i * es..][..es]),
                    bad.map(|i| &want[i * es..][..es])
                );
            }
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "tens of thousands of elements: minutes under Miri; safe code over the kernels it checks"
    )]
    fn reduce_from_gives_the_bits_of_copy_then_reduce() {
        for dt in [DataType::Fp32, DataType::Fp16, DataType::Bf16, DataType::Int8, DataType::Fp64] {
            for len in [0usize, 3, 4096, FROM_BLOCK + 10, 3 * FROM_BLOCK + 6] {
                let (a, b) = (noise(len, 1), noise(len, 2));
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Prod] {
                    let mut want = a.clone();
                    reduce_into(&mut want, &b, dt, op);
                    let mut got = vec![0xa5u8; len];
                    reduce_from(&mut got, &a, &b, dt, op);
                    let whole = len / dt.size() * dt.size();
                    assert!(same(dt, &got[..whole], &want[..whole]), "{dt:?} {op:?} {len}");
                    assert!(got[whole..].iter().all(|&x| x == 0xa5), "{dt:?} {len}: bytes past the last element");
                }
            }
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "tens of thousands of elements: minutes under Miri; safe code over the kernels it checks"
    )]
    fn reduce_onto_matches_base_then_reduce_even_for_special_values() {
        for dt in [DataType::Fp32, DataType::Fp16, DataType::Bf16, DataType::Int8, DataType::Fp64, DataType::Uint64] {
            let sp = specials(dt);
            let es = dt.size();
            // Every ordered pair of special values, then noise over several blocks.
            let k = sp.len() / es;
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for i in 0..k {
                for j in 0..k {
                    a.extend_from_slice(&sp[i * es..(i + 1) * es]);
                    b.extend_from_slice(&sp[j * es..(j + 1) * es]);
                }
            }
            a.extend(noise(3 * FROM_BLOCK + 8, 5));
            b.extend(noise(3 * FROM_BLOCK + 8, 6));
            let whole = a.len() / es * es;
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
                let mut want = a.clone();
                reduce_into(&mut want, &b, dt, op);
                let mut got = b.clone();
                reduce_onto(&mut got, &a, dt, op);
                assert!(same(dt, &got[..whole], &want[..whole]), "{dt:?} {op:?}");
            }
        }
    }

    #[test]
    fn max_and_min_skip_nan_and_order_infinities() {
        let f = |v: &[f32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let mut d = f(&[f32::NAN, 1.0, f32::NEG_INFINITY, f32::NAN]);
        reduce_into(&mut d, &f(&[2.0, f32::NAN, 3.0, f32::NAN]), DataType::Fp32, ReduceOp::Max);
        let got: Vec<f32> = d.chunks_exact(4).map(f32::load).collect();
        assert_eq!(&got[..3], &[2.0, 1.0, 3.0]);
        assert!(got[3].is_nan());
        let mut d = f(&[f32::INFINITY, -0.5]);
        reduce_into(&mut d, &f(&[f32::NAN, f32::NEG_INFINITY]), DataType::Fp32, ReduceOp::Min);
        assert_eq!(d, f(&[f32::INFINITY, f32::NEG_INFINITY]));
    }

    #[test]
    #[cfg_attr(miri, ignore = "exhaustive: hours under Miri; the natively run suite covers it")]
    fn bf16_rounding_matches_half_on_every_upper_half_and_its_neighbours() {
        for hi in 0..=u16::MAX as u32 {
            for lo in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                let x = (hi << 16) | lo;
                let want = bf16::from_f32(f32::from_bits(x)).to_bits();
                assert_eq!(bf16_round(x), want, "{x:#010x}");
            }
        }
    }
}
