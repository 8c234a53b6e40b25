// The Work of one hccn operation as torch sees it: completed by the backend, either at once (an
// operation run on the caller's thread) or from hccn's stream through hccn_stream_add_callback.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/ivalue.h>

#include <exception>
#include <functional>
#include <vector>

namespace hccn_torch {

class WorkHCCN : public c10d::Work {
 public:
  WorkHCCN(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);

  std::vector<at::Tensor> result() override { return outputs_; }
  // Created on first use; completes with the output tensors (or the error) when the work does.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override { return getFuture(); }

  // Marks the work done: wakes wait(), then completes the future (its callbacks run here, on
  // the completing thread, as Gloo's run on its worker). Called once.
  void complete(std::exception_ptr error);

  // Buffers the queued operations read or write (inputs, staging copies): kept alive until the
  // work is retired by the backend.
  std::vector<at::Tensor> keep;
  // Bytes the queued operations use (p2p headers).
  std::vector<uint8_t> scratch;
  // Runs on the completing thread before completion when every operation succeeded: copies
  // from staging buffers into the caller's tensors.
  std::function<void()> finish;
  // Runs on hccn's stream thread once the operations queued before it have succeeded: blocking
  // steps that depend on what arrives (a receive's tag matching). Throws to fail the work.
  std::function<void()> host_step;

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace hccn_torch
