//! Data types and reduce operations. The numbers are HCCL's (`HcclDataType`, `HcclReduceOp`).

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DataType {
    Int8 = 0,
    Int16 = 1,
    Int32 = 2,
    Fp16 = 3,
    Fp32 = 4,
    Int64 = 5,
    Uint64 = 6,
    Uint8 = 7,
    Uint16 = 8,
    Uint32 = 9,
    Fp64 = 10,
    Bf16 = 11,
}

impl DataType {
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Fp64,
        DataType::Bf16,
    ];

    pub fn from_raw(raw: u32) -> Result<Self> {
        DataType::ALL
            .get(raw as usize)
            .copied()
            .ok_or_else(|| Error::invalid(format!("unknown data type {raw} (valid: 0..=11)")))
    }

    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 => 1,
            DataType::Int16 | DataType::Uint16 | DataType::Fp16 | DataType::Bf16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Fp32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Fp64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Int16 => "int16",
            DataType::Int32 => "int32",
            DataType::Fp16 => "fp16",
            DataType::Fp32 => "fp32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Uint8 => "uint8",
            DataType::Uint16 => "uint16",
            DataType::Uint32 => "uint32",
            DataType::Fp64 => "fp64",
            DataType::Bf16 => "bf16",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        let name = name.to_ascii_lowercase();
        let alias = match name.as_str() {
            "float" | "float32" => "fp32",
            "double" | "float64" => "fp64",
            "half" | "float16" => "fp16",
            "bfloat16" => "bf16",
            "int" => "int32",
            other => other,
        };
        DataType::ALL.into_iter().find(|d| d.name() == alias)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DataType::Fp16 | DataType::Fp32 | DataType::Fp64 | DataType::Bf16)
    }

    /// Bytes in `count` elements, or an error when that does not fit in memory.
    pub fn bytes(self, count: u64) -> Result<usize> {
        count
            .checked_mul(self.size() as u64)
            .filter(|b| *b <= isize::MAX as u64)
            .map(|b| b as usize)
            .ok_or_else(|| Error::invalid(format!("count {count} of {} overflows the address space", self.name())))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ReduceOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    /// Sum divided by the number of ranks; integers truncate toward zero (as NCCL's ncclAvg).
    Avg = 4,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];

    pub fn from_raw(raw: u32) -> Result<Self> {
        ReduceOp::ALL
            .get(raw as usize)
            .copied()
            .ok_or_else(|| Error::invalid(format!("unknown reduce op {raw} (valid: 0..=4)")))
    }

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }
}
