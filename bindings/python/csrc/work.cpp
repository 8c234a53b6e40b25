#include "work.h"

#include <ATen/core/jit_type.h>

namespace hccn_torch {

namespace {
c10::intrusive_ptr<c10::ivalue::Future> new_future() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}
}  // namespace

WorkHCCN::WorkHCCN(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type), outputs_(std::move(outputs)) {}

c10::intrusive_ptr<c10::ivalue::Future> WorkHCCN::getFuture() {
  std::lock_guard<std::mutex> g(mutex_);
  if (!future_) {
    future_ = new_future();
    // Already done: nobody else can see this future yet, so it is completed here.
    if (completed_) {
      if (exception_)
        future_->setError(exception_);
      else
        future_->markCompleted(c10::IValue(outputs_));
    }
  }
  return future_;
}

void WorkHCCN::complete(std::exception_ptr error) {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::lock_guard<std::mutex> g(mutex_);
    completed_ = true;
    exception_ = error;
    fut = future_;
  }
  cv_.notify_all();
  if (fut) {
    if (error)
      fut->setError(error);
    else
      fut->markCompleted(c10::IValue(outputs_));
  }
}

}  // namespace hccn_torch
