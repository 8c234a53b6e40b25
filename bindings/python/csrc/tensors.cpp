#include "tensors.h"

#include <ATen/ATen.h>

namespace hccn_torch {

hccn_datatype datatype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return HCCN_FP32;
    case at::kDouble: return HCCN_FP64;
    case at::kHalf: return HCCN_FP16;
    case at::kBFloat16: return HCCN_BF16;
    case at::kChar: return HCCN_INT8;
    case at::kShort: return HCCN_INT16;
    case at::kInt: return HCCN_INT32;
    case at::kLong: return HCCN_INT64;
    case at::kByte: return HCCN_UINT8;
    case at::kBool: return HCCN_UINT8;  // one byte per element; reductions mapped in reduce_op
    case at::kUInt16: return HCCN_UINT16;
    case at::kUInt32: return HCCN_UINT32;
    case at::kUInt64: return HCCN_UINT64;
    default: invalid(std::string("tensors of type ") + c10::toString(t.scalar_type()) + " are not supported");
  }
}

void check_cpu(const at::Tensor& t, const char* op) {
  if (!t.defined()) invalid(std::string(op) + ": a tensor is undefined");
  if (t.device().type() != at::kCPU)
    invalid(std::string(op) + ": the tensor is on " + t.device().str() + "; the hccn backend takes CPU tensors");
  if (t.layout() != at::kStrided) invalid(std::string(op) + ": sparse tensors are not supported");
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op) {
  if (tensors.size() != 1)
    invalid(std::string(op) + " takes one tensor per call on CPU, got " + std::to_string(tensors.size()));
  check_cpu(tensors[0], op);
  return tensors[0];
}

at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

void check_list(const std::vector<at::Tensor>& list, size_t count, int64_t numel, at::ScalarType dtype,
                const char* op, const char* what) {
  if (list.size() != count)
    invalid(std::string(op) + ": " + what + " needs " + std::to_string(count) + " tensors, got " +
            std::to_string(list.size()));
  for (size_t i = 0; i < list.size(); i++) {
    check_cpu(list[i], op);
    if (list[i].numel() != numel || list[i].scalar_type() != dtype)
      invalid(std::string(op) + ": " + what + "[" + std::to_string(i) + "] has " + std::to_string(list[i].numel()) +
              " elements of " + c10::toString(list[i].scalar_type()) + ", expected " + std::to_string(numel) +
              " of " + c10::toString(dtype));
  }
}

at::Tensor flat_copy(const std::vector<at::Tensor>& list) {
  std::vector<at::Tensor> rows;
  rows.reserve(list.size());
  for (const auto& t : list) rows.push_back(t.reshape({-1}));
  return at::cat(rows);
}

void unflatten_into(const at::Tensor& flat, std::vector<at::Tensor>& list) {
  int64_t at_ = 0;
  for (auto& t : list) {
    int64_t n = t.numel();
    t.copy_(flat.narrow(0, at_, n).view(t.sizes()));
    at_ += n;
  }
}

}  // namespace hccn_torch
