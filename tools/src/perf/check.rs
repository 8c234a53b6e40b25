//! Input patterns and expected results for `hccn-perf -c`.
//!
//! Rank r's input element i is `(r + i) % m + 1`: small integers, exact in every data type, so
//! every expected result is known exactly. For PROD, m is 2 so that products are powers of two,
//! which no order of multiplication can round differently; otherwise m is 7.

use half::{bf16, f16};
use hccn_runtime::{DataType, ReduceOp};

use super::Coll;

/// An element value: integers wrap like the runtime's kernels, floats are held exactly in f64.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Int(i128),
    Float(f64),
}

/// `x` converted to `dt`, wrapping integers as a cast does.
fn encode(dt: DataType, x: Num) -> Vec<u8> {
    let (i, f) = match x {
        Num::Int(i) => (i, i as f64),
        Num::Float(f) => (f as i128, f),
    };
    match dt {
        DataType::Int8 => (i as i8).to_ne_bytes().to_vec(),
        DataType::Int16 => (i as i16).to_ne_bytes().to_vec(),
        DataType::Int32 => (i as i32).to_ne_bytes().to_vec(),
        DataType::Int64 => (i as i64).to_ne_bytes().to_vec(),
        DataType::Uint8 => (i as u8).to_ne_bytes().to_vec(),
        DataType::Uint16 => (i as u16).to_ne_bytes().to_vec(),
        DataType::Uint32 => (i as u32).to_ne_bytes().to_vec(),
        DataType::Uint64 => (i as u64).to_ne_bytes().to_vec(),
        DataType::Fp16 => f16::from_f64(f).to_bits().to_ne_bytes().to_vec(),
        DataType::Bf16 => bf16::from_f64(f).to_bits().to_ne_bytes().to_vec(),
        DataType::Fp32 => (f as f32).to_ne_bytes().to_vec(),
        DataType::Fp64 => f.to_ne_bytes().to_vec(),
    }
}

fn decode(dt: DataType, b: &[u8]) -> Num {
    let a2 = || [b[0], b[1]];
    let a4 = || [b[0], b[1], b[2], b[3]];
    let a8 = || [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
    match dt {
        DataType::Int8 => Num::Int(i8::from_ne_bytes([b[0]]).into()),
        DataType::Int16 => Num::Int(i16::from_ne_bytes(a2()).into()),
        DataType::Int32 => Num::Int(i32::from_ne_bytes(a4()).into()),
        DataType::Int64 => Num::Int(i64::from_ne_bytes(a8()).into()),
        DataType::Uint8 => Num::Int(b[0].into()),
        DataType::Uint16 => Num::Int(u16::from_ne_bytes(a2()).into()),
        DataType::Uint32 => Num::Int(u32::from_ne_bytes(a4()).into()),
        DataType::Uint64 => Num::Int(u64::from_ne_bytes(a8()).into()),
        DataType::Fp16 => Num::Float(f16::from_bits(u16::from_ne_bytes(a2())).to_f64()),
        DataType::Bf16 => Num::Float(bf16::from_bits(u16::from_ne_bytes(a2())).to_f64()),
        DataType::Fp32 => Num::Float(f32::from_ne_bytes(a4()).into()),
        DataType::Fp64 => Num::Float(f64::from_ne_bytes(a8())),
    }
}

/// Relative rounding step of a float type.
fn epsilon(dt: DataType) -> f64 {
    match dt {
        DataType::Fp16 => f64::from(f16::EPSILON),
        DataType::Bf16 => f64::from(bf16::EPSILON),
        DataType::Fp32 => f64::from(f32::EPSILON),
        _ => f64::EPSILON,
    }
}

/// `x` as stored in `dt` and read back: integer results wrap at the type's width.
fn in_type(dt: DataType, x: i128) -> i128 {
    match decode(dt, &encode(dt, Num::Int(x))) {
        Num::Int(v) => v,
        Num::Float(v) => v as i128,
    }
}

/// One expected element: its exact bytes and, for float reductions, the slack allowed for the
/// rounding order of the algorithm (the inputs' partial results are not all exact in fp16/bf16
/// at many ranks, and AVG rounds its quotient).
#[derive(Debug, Clone)]
struct Expected {
    bytes: Vec<u8>,
    value: f64,
    slack: f64,
}

/// Fills inputs and counts wrong elements for one collective, data type and reduce op.
#[derive(Debug)]
pub struct Checker {
    coll: Coll,
    dt: DataType,
    rank: u32,
    nranks: u32,
    root: u32,
    modulus: usize,
    /// The input value `k + 1` encoded in `dt`, at index k.
    inputs: Vec<Vec<u8>>,
    /// The reduction over all ranks of element q, at index `q % modulus`.
    reduced: Vec<Expected>,
}

impl Checker {
    pub fn new(coll: Coll, dt: DataType, op: ReduceOp, rank: u32, nranks: u32, root: u32) -> Checker {
        let modulus = if op == ReduceOp::Prod { 2 } else { 7 };
        let inputs = (1..=modulus).map(|v| encode(dt, Num::Int(v as i128))).collect();
        let reduced = (0..modulus).map(|q| reduction(dt, op, nranks, modulus, q)).collect();
        Checker { coll, dt, rank, nranks, root, modulus, inputs, reduced }
    }

    fn input(&self, rank: u32, i: usize) -> &[u8] {
        &self.inputs[(rank as usize + i) % self.modulus]
    }

    /// Writes this rank's input pattern into `buf` (every whole element).
    pub fn fill(&self, buf: &mut [u8]) {
        let es = self.dt.size();
        for (i, e) in buf.chunks_exact_mut(es).enumerate() {
            e.copy_from_slice(self.input(self.rank, i));
        }
    }

    fn is_right(&self, got: &[u8], want: &Expected) -> bool {
        if got == want.bytes.as_slice() {
            return true;
        }
        match decode(self.dt, got) {
            Num::Float(g) => want.slack > 0.0 && (g - want.value).abs() <= want.slack,
            Num::Int(_) => false,
        }
    }

    /// Wrong elements in this rank's result `out` of an operation on `count` elements per
    /// rank (the count column of the table).
    pub fn wrong(&self, out: &[u8], count: usize) -> u64 {
        let es = self.dt.size();
        let elems = out.chunks_exact(es);
        let me = self.rank as usize;
        let bad = |ok: bool| u64::from(!ok);
        let exact = |got: &[u8], want: &[u8]| got == want;
        match self.coll {
            // Only the root receives a reduce's result.
            Coll::Reduce if self.rank != self.root => 0,
            Coll::AllReduce | Coll::Reduce => {
                elems.take(count).enumerate().map(|(j, e)| bad(self.is_right(e, &self.reduced[j % self.modulus]))).sum()
            }
            Coll::ReduceScatter => elems
                .take(count)
                .enumerate()
                .map(|(j, e)| bad(self.is_right(e, &self.reduced[(me * count + j) % self.modulus])))
                .sum(),
            Coll::Broadcast => {
                elems.take(count).enumerate().map(|(j, e)| bad(exact(e, self.input(self.root, j)))).sum()
            }
            Coll::AllGather => elems
                .take(count * self.nranks as usize)
                .enumerate()
                .map(|(i, e)| bad(exact(e, self.input((i / count) as u32, i % count))))
                .sum(),
            Coll::AllToAll => elems
                .take(count * self.nranks as usize)
                .enumerate()
                .map(|(i, e)| bad(exact(e, self.input((i / count) as u32, me * count + i % count))))
                .sum(),
            // Only the root receives a gather's result.
            Coll::Gather if self.rank != self.root => 0,
            Coll::Gather => elems
                .take(count * self.nranks as usize)
                .enumerate()
                .map(|(i, e)| bad(exact(e, self.input((i / count) as u32, i % count))))
                .sum(),
            Coll::Scatter => {
                elems.take(count).enumerate().map(|(j, e)| bad(exact(e, self.input(self.root, me * count + j)))).sum()
            }
            Coll::SendRecv => {
                let from = (self.rank + self.nranks - 1) % self.nranks;
                elems.take(count).enumerate().map(|(j, e)| bad(exact(e, self.input(from, j)))).sum()
            }
        }
    }
}

/// The result every rank's element q reduces to.
fn reduction(dt: DataType, op: ReduceOp, nranks: u32, modulus: usize, q: usize) -> Expected {
    let values = (0..nranks as usize).map(|r| ((r + q) % modulus + 1) as i128);
    let n = i128::from(nranks);
    if !dt.is_float() {
        let v = match op {
            ReduceOp::Sum => values.fold(0, |acc, v| in_type(dt, acc + v)),
            ReduceOp::Prod => values.fold(1, |acc, v| in_type(dt, acc * v)),
            ReduceOp::Max => values.max().unwrap_or(0),
            ReduceOp::Min => values.min().unwrap_or(0),
            ReduceOp::Avg => values.fold(0, |acc, v| in_type(dt, acc + v)) / n,
        };
        let v = in_type(dt, v);
        return Expected { bytes: encode(dt, Num::Int(v)), value: v as f64, slack: 0.0 };
    }
    // Sums of at most 7 * nranks and products of powers of two are exact in f64.
    let v: f64 = match op {
        ReduceOp::Sum => values.sum::<i128>() as f64,
        ReduceOp::Prod => values.map(|v| v as f64).product(),
        ReduceOp::Max => values.max().unwrap_or(0) as f64,
        ReduceOp::Min => values.min().unwrap_or(0) as f64,
        ReduceOp::Avg => values.sum::<i128>() as f64 / nranks as f64,
    };
    let slack = match op {
        ReduceOp::Max | ReduceOp::Min => 0.0,
        _ => f64::from(nranks) * epsilon(dt) * v.abs(),
    };
    let bytes = encode(dt, Num::Float(v));
    let value = match decode(dt, &bytes) {
        Num::Float(f) => f,
        Num::Int(i) => i as f64,
    };
    Expected { bytes, value, slack }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates a collective by hand for a few ranks and checks the checker agrees.
    fn inputs(c: &Checker, rank: u32, elems: usize) -> Vec<u8> {
        let me = Checker { rank, ..Checker::new(c.coll, c.dt, ReduceOp::Sum, rank, c.nranks, c.root) };
        let mut b = vec![0u8; elems * c.dt.size()];
        me.fill(&mut b);
        b
    }

    #[test]
    fn allreduce_sum_matches_a_manual_sum() {
        for dt in DataType::ALL {
            let c = Checker::new(Coll::AllReduce, dt, ReduceOp::Sum, 0, 3, 0);
            let count = 20;
            let es = dt.size();
            let mut out = vec![0u8; count * es];
            let all: Vec<Vec<u8>> = (0..3).map(|r| inputs(&c, r, count)).collect();
            for j in 0..count {
                let sum: i128 = all
                    .iter()
                    .map(|b| match decode(dt, &b[j * es..(j + 1) * es]) {
                        Num::Int(i) => i,
                        Num::Float(f) => f as i128,
                    })
                    .sum();
                out[j * es..(j + 1) * es].copy_from_slice(&encode(dt, Num::Int(sum)));
            }
            assert_eq!(c.wrong(&out, count), 0, "{dt:?}");
            out[es..2 * es].copy_from_slice(&encode(dt, Num::Int(100)));
            assert_eq!(c.wrong(&out, count), 1, "{dt:?}");
        }
    }

    #[test]
    fn integer_results_wrap_and_avg_truncates() {
        // 40 ranks of int8 sum to more than 127.
        let e = reduction(DataType::Int8, ReduceOp::Sum, 40, 7, 0);
        let total: i128 = (0..40).map(|r| (r % 7 + 1) as i128).sum();
        assert_eq!(e.bytes, vec![total as i8 as u8]);
        let e = reduction(DataType::Int32, ReduceOp::Avg, 2, 7, 0);
        assert_eq!(e.bytes, 1i32.to_ne_bytes().to_vec(), "(1 + 2) / 2 truncates");
        let e = reduction(DataType::Uint8, ReduceOp::Prod, 9, 2, 0);
        assert_eq!(e.bytes, vec![16], "four of nine ranks contribute a 2");
        let e = reduction(DataType::Uint8, ReduceOp::Prod, 17, 2, 0);
        assert_eq!(e.bytes, vec![0], "2^8 wraps in uint8");
    }

    #[test]
    fn float_avg_allows_rounding_only() {
        let e = reduction(DataType::Fp16, ReduceOp::Avg, 3, 7, 0);
        assert!((e.value - 2.0).abs() < 1e-9);
        let c = Checker::new(Coll::AllReduce, DataType::Fp16, ReduceOp::Avg, 0, 3, 0);
        let near = f16::from_f64(2.0 + 2.0 * 0.000977).to_bits().to_ne_bytes();
        assert!(c.is_right(&near, &e));
        let far = f16::from_f64(2.5).to_bits().to_ne_bytes();
        assert!(!c.is_right(&far, &e));
    }

    #[test]
    fn gather_layouts() {
        let count = 5;
        let n = 3;
        let me = 1;
        let c = Checker::new(Coll::AllToAll, DataType::Int32, ReduceOp::Sum, me, n, 0);
        let sends: Vec<Vec<u8>> = (0..n).map(|r| inputs(&c, r, count * n as usize)).collect();
        let block = count * 4;
        let out: Vec<u8> =
            (0..n as usize).flat_map(|k| sends[k][me as usize * block..(me as usize + 1) * block].to_vec()).collect();
        assert_eq!(c.wrong(&out, count), 0);
        let g = Checker::new(Coll::AllGather, DataType::Int32, ReduceOp::Sum, me, n, 0);
        let gathered: Vec<u8> = (0..n).flat_map(|r| inputs(&g, r, count)).collect();
        assert_eq!(g.wrong(&gathered, count), 0);
        assert!(c.wrong(&gathered, count) > 0, "alltoall is not allgather");
        let root = Checker::new(Coll::Gather, DataType::Int32, ReduceOp::Sum, me, n, me);
        assert_eq!(root.wrong(&gathered, count), 0);
        let other = Checker::new(Coll::Gather, DataType::Int32, ReduceOp::Sum, me, n, 0);
        assert_eq!(other.wrong(&[0u8; 4], count), 0, "only the root receives");
    }

    #[test]
    fn scatter_and_sendrecv_blocks() {
        let (count, n, root) = (3usize, 4u32, 2u32);
        let s = Checker::new(Coll::Scatter, DataType::Int64, ReduceOp::Sum, 1, n, root);
        let sent = inputs(&s, root, count * n as usize);
        assert_eq!(s.wrong(&sent[count * 8..2 * count * 8], count), 0, "rank 1 gets block 1");
        assert!(s.wrong(&sent[..count * 8], count) > 0, "not block 0");
        let r = Checker::new(Coll::SendRecv, DataType::Fp32, ReduceOp::Sum, 0, n, 0);
        assert_eq!(r.wrong(&inputs(&r, n - 1, count), count), 0, "rank 0 hears from the last rank");
        assert_eq!(r.wrong(&inputs(&r, 1, count), count), count as u64);
    }
}
