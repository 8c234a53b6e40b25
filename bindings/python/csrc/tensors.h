// Tensors as hccn buffers: element types, the checks every operation makes, and the staging
// copies that non-contiguous tensors and tensor lists need.
#pragma once

#include "hccn_api.h"

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace hccn_torch {

// hccn's type for `t`'s elements; throws for types hccn does not carry (complex tensors are
// viewed as real pairs by torch.distributed before they get here).
hccn_datatype datatype_of(const at::Tensor& t);

// Throws unless `t` is a dense CPU tensor.
void check_cpu(const at::Tensor& t, const char* op);

// The one tensor of a per-device list (CPU groups take one tensor per call).
at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op);

// `t` itself when it is contiguous, else a contiguous copy of it.
at::Tensor dense(const at::Tensor& t);

// True when `staged` is a copy of `t` that must be copied back into `t` when the work is done.
inline bool is_staged(const at::Tensor& staged, const at::Tensor& t) { return !staged.is_same(t); }

// Every tensor of `list` has `numel` elements of `dtype`; throws naming `what` otherwise.
void check_list(const std::vector<at::Tensor>& list, size_t count, int64_t numel, at::ScalarType dtype,
                const char* op, const char* what);

// The tensors of `list` one after another in a new 1-D tensor (one copy each).
at::Tensor flat_copy(const std::vector<at::Tensor>& list);

// Copies consecutive pieces of `flat` into the tensors of `list` (their sizes).
void unflatten_into(const at::Tensor& flat, std::vector<at::Tensor>& list);

inline uint64_t count_of(const at::Tensor& t) { return uint64_t(t.numel()); }

}  // namespace hccn_torch
