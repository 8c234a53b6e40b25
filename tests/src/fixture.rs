//! Gloo-style fixtures: element j of rank r is a small integer formula of (r, j), held exactly by
//! every data type, so each rank computes the exact expected result of every collective.

use half::{bf16, f16};
use hccn_runtime::{DataType, ReduceOp};

/// Rank r's input element j for `op`: small enough that sums of 8 ranks fit in int8 and
/// products stay below 2^3; signed types get negative values so AVG's truncation shows.
pub fn input(dt: DataType, op: ReduceOp, rank: u32, j: usize) -> i64 {
    let (r, j) = (rank as i64, j as i64);
    match op {
        ReduceOp::Prod => {
            if (r + j) % 3 == 0 {
                2
            } else {
                1
            }
        }
        _ if is_signed(dt) => (r * 3 + j) % 5 - 2,
        _ => (r * 3 + j) % 5 + 1,
    }
}

fn is_signed(dt: DataType) -> bool {
    !matches!(dt, DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64)
}

/// The bytes of one element with integer value `v`.
pub fn encode(dt: DataType, v: i64) -> Vec<u8> {
    match dt {
        DataType::Int8 => (v as i8).to_ne_bytes().to_vec(),
        DataType::Int16 => (v as i16).to_ne_bytes().to_vec(),
        DataType::Int32 => (v as i32).to_ne_bytes().to_vec(),
        DataType::Int64 => v.to_ne_bytes().to_vec(),
        DataType::Uint8 => (v as u8).to_ne_bytes().to_vec(),
        DataType::Uint16 => (v as u16).to_ne_bytes().to_vec(),
        DataType::Uint32 => (v as u32).to_ne_bytes().to_vec(),
        DataType::Uint64 => (v as u64).to_ne_bytes().to_vec(),
        DataType::Fp16 => f16::from_f32(v as f32).to_bits().to_ne_bytes().to_vec(),
        DataType::Bf16 => bf16::from_f32(v as f32).to_bits().to_ne_bytes().to_vec(),
        DataType::Fp32 => (v as f32).to_ne_bytes().to_vec(),
        DataType::Fp64 => (v as f64).to_ne_bytes().to_vec(),
    }
}

/// The bytes of `sum / n` as the library computes an AVG: integer division truncating toward
/// zero, floats divided in their own precision (FP16/BF16 through f32).
pub fn encode_avg(dt: DataType, sum: i64, n: u32) -> Vec<u8> {
    let n64 = n as i64;
    match dt {
        DataType::Fp16 => f16::from_f32(sum as f32 / n as f32).to_bits().to_ne_bytes().to_vec(),
        DataType::Bf16 => bf16::from_f32(sum as f32 / n as f32).to_bits().to_ne_bytes().to_vec(),
        DataType::Fp32 => (sum as f32 / n as f32).to_ne_bytes().to_vec(),
        DataType::Fp64 => (sum as f64 / n as f64).to_ne_bytes().to_vec(),
        _ => encode(dt, sum / n64),
    }
}

/// A buffer of `count` elements of rank `rank`'s input, starting at element `offset`.
pub fn fill(dt: DataType, op: ReduceOp, rank: u32, offset: usize, count: usize) -> Vec<u8> {
    (0..count).flat_map(|j| encode(dt, input(dt, op, rank, offset + j))).collect()
}

/// The exact reduction over `ranks` of element j.
pub fn reduced(dt: DataType, op: ReduceOp, ranks: &[u32], j: usize) -> Vec<u8> {
    let vals = ranks.iter().map(|&r| input(dt, op, r, j));
    match op {
        ReduceOp::Sum => encode(dt, vals.sum()),
        ReduceOp::Prod => encode(dt, vals.product()),
        ReduceOp::Max => encode(dt, vals.max().unwrap_or(0)),
        ReduceOp::Min => encode(dt, vals.min().unwrap_or(0)),
        ReduceOp::Avg => encode_avg(dt, vals.sum(), ranks.len() as u32),
    }
}

/// `count` reduced elements starting at element `offset`.
pub fn reduced_block(dt: DataType, op: ReduceOp, ranks: &[u32], offset: usize, count: usize) -> Vec<u8> {
    (0..count).flat_map(|j| reduced(dt, op, ranks, offset + j)).collect()
}

/// Index of the first differing element, for failure messages.
pub fn first_diff(dt: DataType, got: &[u8], want: &[u8]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(usize::MAX);
    }
    got.chunks(dt.size()).zip(want.chunks(dt.size())).position(|(a, b)| a != b)
}
