// The collectives of ProcessGroupHCCN: each checks its tensors, stages what hccn cannot take as
// it is (non-contiguous tensors, lists of tensors), and issues one or more hccn calls through
// run(), which runs them now or queues them (see backend.h).
#include "backend.h"
#include "tensors.h"

#include <ATen/ATen.h>

#include <cstring>

namespace hccn_torch {

using c10d::OpType;

hccn_reduce_op ProcessGroupHCCN::reduce_op(const c10d::ReduceOp& op, const at::Tensor& t) const {
  // Bools travel as bytes: their sum is a logical or, their product a logical and.
  const bool boolean = t.scalar_type() == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return boolean ? HCCN_MAX : HCCN_SUM;
    case c10d::ReduceOp::PRODUCT: return boolean ? HCCN_MIN : HCCN_PROD;
    case c10d::ReduceOp::MIN: return HCCN_MIN;
    case c10d::ReduceOp::MAX: return HCCN_MAX;
    case c10d::ReduceOp::AVG:
      if (boolean) invalid("AVG of bool tensors is not defined");
      return HCCN_AVG;
    default:
      invalid("reduce op " + std::to_string(int(op.op_)) +
              " is not supported (SUM, AVG, PRODUCT, MIN and MAX are; not the bitwise ops nor PREMUL_SUM)");
  }
}

void ProcessGroupHCCN::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_)
    invalid(std::string(what) + " rank " + std::to_string(peer) + " is out of range for a group of " +
            std::to_string(size_));
}

namespace {
// After the operation on `staged`, `t` gets its values (when `staged` is a copy).
std::function<void()> copy_back(const at::Tensor& staged, const at::Tensor& t) {
  if (!is_staged(staged, t)) return nullptr;
  return [staged, t]() mutable { t.copy_(staged); };
}
}  // namespace

// -- in place on one tensor ----------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  at::Tensor& t = single(tensors, "allreduce");
  const hccn_datatype dt = datatype_of(t);
  const hccn_reduce_op op = reduce_op(opts.reduceOp, t);
  at::Tensor d = dense(t);
  void* p = d.data_ptr();
  const uint64_t n = count_of(d);
  auto issue = [&](hccn_stream* s) { check(api().hccn_allreduce(p, p, n, dt, op, comm_, s), comm_); };
  if (!is_staged(d, t)) return run_direct(OpType::ALLREDUCE, tensors, opts.asyncOp, issue);
  auto work = make_work(OpType::ALLREDUCE, tensors);
  work->finish = copy_back(d, t);
  work->keep.push_back(d);
  return run(work, opts.asyncOp, issue);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  std::vector<at::Tensor> staged;
  std::vector<std::function<void()>> backs;
  for (auto& t : tensors) {
    check_cpu(t, "allreduce_coalesced");
    staged.push_back(dense(t));
    if (auto b = copy_back(staged.back(), t)) backs.push_back(std::move(b));
  }
  std::vector<hccn_reduce_op> ops;
  for (auto& t : tensors) ops.push_back(reduce_op(opts.reduceOp, t));
  auto work = make_work(OpType::ALLREDUCE_COALESCED, tensors);
  work->keep = staged;
  if (!backs.empty())
    work->finish = [backs]() {
      for (auto& b : backs) b();
    };
  return run(work, opts.asyncOp, [&](hccn_stream* s) {
    for (size_t i = 0; i < staged.size(); i++) {
      void* p = staged[i].data_ptr();
      check(api().hccn_allreduce(p, p, count_of(staged[i]), datatype_of(staged[i]), ops[i], comm_, s), comm_);
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  at::Tensor& t = single(tensors, "broadcast");
  check_peer(int(opts.rootRank), "broadcast: root");
  const hccn_datatype dt = datatype_of(t);
  at::Tensor d = dense(t);
  void* p = d.data_ptr();
  const uint64_t n = count_of(d);
  const uint32_t root = uint32_t(opts.rootRank);
  auto issue = [&](hccn_stream* s) { check(api().hccn_broadcast(p, n, dt, root, comm_, s), comm_); };
  if (!is_staged(d, t)) return run_direct(OpType::BROADCAST, tensors, opts.asyncOp, issue);
  auto work = make_work(OpType::BROADCAST, tensors);
  work->finish = copy_back(d, t);
  work->keep.push_back(d);
  return run(work, opts.asyncOp, issue);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  at::Tensor& t = single(tensors, "reduce");
  check_peer(int(opts.rootRank), "reduce: root");
  const hccn_datatype dt = datatype_of(t);
  const hccn_reduce_op op = reduce_op(opts.reduceOp, t);
  at::Tensor d = dense(t);
  void* p = d.data_ptr();
  const uint64_t n = count_of(d);
  const uint32_t root = uint32_t(opts.rootRank);
  auto issue = [&](hccn_stream* s) { check(api().hccn_reduce(p, p, n, dt, op, root, comm_, s), comm_); };
  if (!is_staged(d, t)) return run_direct(OpType::REDUCE, tensors, opts.asyncOp, issue);
  auto work = make_work(OpType::REDUCE, tensors);
  work->finish = copy_back(d, t);
  work->keep.push_back(d);
  return run(work, opts.asyncOp, issue);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::barrier(const c10d::BarrierOptions& opts) {
  return run_direct(OpType::BARRIER, {}, opts.asyncOp,
                    [&](hccn_stream* s) { check(api().hccn_barrier(comm_, s), comm_); });
}

// -- gathers ---------------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::all_gather_single(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return all_gather_single_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::all_gather_single_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  if (outputs.size() != inputs.size())
    invalid("all_gather_into_tensor: " + std::to_string(inputs.size()) + " inputs but " +
            std::to_string(outputs.size()) + " outputs");
  std::vector<at::Tensor> ins, outs;
  std::vector<std::function<void()>> backs;
  for (size_t i = 0; i < inputs.size(); i++) {
    check_cpu(inputs[i], "all_gather_into_tensor");
    check_cpu(outputs[i], "all_gather_into_tensor");
    if (outputs[i].numel() != inputs[i].numel() * size_ || outputs[i].scalar_type() != inputs[i].scalar_type())
      invalid("all_gather_into_tensor: the output needs " + std::to_string(inputs[i].numel() * size_) +
              " elements of the input's type, has " + std::to_string(outputs[i].numel()));
    ins.push_back(dense(inputs[i]));
    outs.push_back(dense(outputs[i]));
    if (auto b = copy_back(outs.back(), outputs[i])) backs.push_back(std::move(b));
  }
  auto work = make_work(inputs.size() == 1 ? OpType::_ALLGATHER_BASE : OpType::ALLGATHER_INTO_TENSOR_COALESCED,
                        outputs);
  work->keep = ins;
  work->keep.insert(work->keep.end(), outs.begin(), outs.end());
  if (!backs.empty())
    work->finish = [backs]() {
      for (auto& b : backs) b();
    };
  return run(work, opts.asyncOp, [&](hccn_stream* s) {
    for (size_t i = 0; i < ins.size(); i++)
      check(api().hccn_allgather(ins[i].data_ptr(), outs[i].data_ptr(), count_of(ins[i]), datatype_of(ins[i]), comm_, s),
            comm_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions& opts) {
  at::Tensor& in = single(inputs, "all_gather");
  if (outputs.size() != 1) invalid("all_gather takes one list of output tensors on CPU");
  check_list(outputs[0], size_t(size_), in.numel(), in.scalar_type(), "all_gather", "the output list");
  at::Tensor d = dense(in);
  at::Tensor flat = at::empty({in.numel() * size_}, d.options());
  auto work = make_work(OpType::ALLGATHER, outputs[0]);
  work->keep = {d, flat};
  std::vector<at::Tensor> outs = outputs[0];
  work->finish = [flat, outs]() mutable { unflatten_into(flat, outs); };
  const hccn_datatype dt = datatype_of(d);
  return run(work, opts.asyncOp, [&](hccn_stream* s) {
    check(api().hccn_allgather(d.data_ptr(), flat.data_ptr(), count_of(d), dt, comm_, s), comm_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::gather_single(at::Tensor& output, at::Tensor& input,
                                                               const c10d::GatherOptions& opts) {
  check_cpu(input, "gather");
  check_peer(int(opts.rootRank), "gather: root");
  const bool root = rank_ == opts.rootRank;
  at::Tensor d = dense(input);
  at::Tensor out;
  if (root) {
    check_cpu(output, "gather");
    if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type())
      invalid("gather: the output needs " + std::to_string(input.numel() * size_) + " elements of the input's type");
    out = dense(output);
  }
  auto work = make_work(OpType::GATHER, root ? std::vector<at::Tensor>{output} : std::vector<at::Tensor>{});
  if (root) work->finish = copy_back(out, output);
  work->keep = {d};
  if (root) work->keep.push_back(out);
  // Other ranks' receive buffer is never touched; hccn only asks that it is not NULL.
  void* recv = root ? out.data_ptr() : d.data_ptr();
  const uint32_t r = uint32_t(opts.rootRank);
  return run(work, opts.asyncOp, [&](hccn_stream* s) {
    check(api().hccn_gather(d.data_ptr(), recv, count_of(d), datatype_of(d), r, comm_, s), comm_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  at::Tensor& in = single(inputs, "gather");
  check_peer(int(opts.rootRank), "gather: root");
  const bool root = rank_ == opts.rootRank;
  std::vector<at::Tensor> outs;
  if (root) {
    if (outputs.size() != 1) invalid("gather: the root passes one list of output tensors");
    check_list(outputs[0], size_t(size_), in.numel(), in.scalar_type(), "gather", "gather_list");
    outs = outputs[0];
  } else if (!outputs.empty() && !outputs[0].empty()) {
    invalid("gather: only the root passes output tensors");
  }
  at::Tensor d = dense(in);
  at::Tensor flat = root ? at::empty({in.numel() * size_}, d.options()) : d;
  auto work = make_work(OpType::GATHER, outs);
  work->keep = {d, flat};
  if (root) work->finish = [flat, outs]() mutable { unflatten_into(flat, outs); };
  const uint32_t r = uint32_t(opts.rootRank);
  // Other ranks' receive buffer is never touched; hccn only asks that it is not NULL.
  return run(work, opts.asyncOp, [&](hccn_stream* s) {
    check(api().hccn_gather(d.data_ptr(), flat.data_ptr(), count_of(d), datatype_of(d), r, comm_, s), comm_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  at::Tensor& out = single(outputs, "scatter");
  check_peer(int(opts.rootRank), "scatter: root");
  const bool root = rank_ == opts.rootRank;
  at::Tensor flat;
  if (root) {
    if (inputs.size() != 1) invalid("scatter: the root passes one list of input tensors");
    check_list(inputs[0], size_t(size_), out.numel(), out.scalar_type(), "scatter", "scatter_list");
    flat = flat_copy(inputs[0]);
  } else if (!inputs.empty() && !inputs[0].empty()) {
    invalid("scatter: only the root passes input tensors");
  }
  at::Tensor d = dense(out);
  auto work = make_work(OpType::SCATTER, outputs);
  work->finish = copy_back(d, out);
  work->keep = {d};
  if (root) work->keep.push_back(flat);
  // Other ranks' send buffer is never read; hccn only asks that it is not NULL.
  void* send = root ? flat.data_ptr() : d.data_ptr();
  const uint32_t r = uint32_t(opts.rootRank);
  return run(work, opts.asyncOp, [&](hccn_stream* s) {
    check(api().hccn_scatter(send, d.data_ptr(), count_of(d), datatype_of(d), r, comm_, s), comm_);
  });
}

// -- reduce-scatters -------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return reduce_scatter_single_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::reduce_scatter_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (outputs.size() != inputs.size())
    invalid("reduce_scatter_tensor: " + std::to_string(inputs.size()) + " inputs but " +
            std::to_string(outputs.size()) + " outputs");
  std::vector<at::Tensor> ins, outs;
  std::vector<hccn_reduce_op> ops;
  std::vector<std::function<void()>> backs;
  for (size_t i = 0; i < inputs.size(); i++) {
    check_cpu(inputs[i], "reduce_scatter_tensor");
    check_cpu(outputs[i], "reduce_scatter_tensor");
    if (inputs[i].numel() != outputs[i].numel() * size_ || outputs[i].scalar_type() != inputs[i].scalar_type())
      invalid("reduce_scatter_tensor: the input needs " + std::to_string(outputs[i].numel() * size_) +
              " elements of the output's type, has " + std::to_string(inputs[i].numel()));
    ins.push_back(dense(inputs[i]));
    outs.push_back(dense(outputs[i]));
    ops.push_back(reduce_op(opts.reduceOp, inputs[i]));
    if (auto b = copy_back(outs.back(), outputs[i])) backs.push_back(std::move(b));
  }
  auto work = make_work(
      inputs.size() == 1 ? OpType::_REDUCE_SCATTER_BASE : OpType::REDUCE_SCATTER_TENSOR_COALESCED, outputs);
  work->keep = ins;
  work->keep.insert(work->keep.end(), outs.begin(), outs.end());
  if (!backs.empty())
    work->finish = [backs]() {
      for (auto& b : backs) b();
    };
  return run(work, opts.asyncOp, [&](hccn_stream* s) {
    for (size_t i = 0; i < ins.size(); i++)
      check(api().hccn_reduce_scatter(ins[i].data_ptr(), outs[i].data_ptr(), count_of(outs[i]),
                                      datatype_of(ins[i]), ops[i], comm_, s),
            comm_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  at::Tensor& out = single(outputs, "reduce_scatter");
  if (inputs.size() != 1) invalid("reduce_scatter takes one list of input tensors on CPU");
  check_list(inputs[0], size_t(size_), out.numel(), out.scalar_type(), "reduce_scatter", "the input list");
  std::vector<at::Tensor> outs{out}, ins{flat_copy(inputs[0])};
  return reduce_scatter_single_coalesced(outs, ins, opts);
}

// -- all to all ------------------------------------------------------------------------------------

namespace {
// Element counts per rank from torch's split sizes (in rows of the first dimension), or an even
// split when none are given.
std::vector<uint64_t> counts_of(const at::Tensor& t, const std::vector<int64_t>& splits, int size, const char* what) {
  std::vector<uint64_t> counts(static_cast<size_t>(size));
  if (splits.empty()) {
    if (t.numel() % size != 0)
      invalid(std::string("all_to_all_single: ") + what + " has " + std::to_string(t.numel()) +
              " elements, not a multiple of the group size " + std::to_string(size));
    std::fill(counts.begin(), counts.end(), uint64_t(t.numel() / size));
    return counts;
  }
  if (splits.size() != size_t(size))
    invalid(std::string("all_to_all_single: ") + what + " split sizes need " + std::to_string(size) + " entries");
  const int64_t row = t.dim() > 0 && t.size(0) > 0 ? t.numel() / t.size(0) : 1;
  int64_t rows = 0;
  for (size_t i = 0; i < splits.size(); i++) {
    if (splits[i] < 0) invalid(std::string("all_to_all_single: a negative split size in ") + what);
    counts[i] = uint64_t(splits[i] * row);
    rows += splits[i];
  }
  if (t.dim() == 0 ? rows > 1 : rows != t.size(0))
    invalid(std::string("all_to_all_single: ") + what + " split sizes add up to " + std::to_string(rows) +
            " rows, the tensor has " + std::to_string(t.dim() ? t.size(0) : 1));
  return counts;
}

std::vector<uint64_t> displacements(const std::vector<uint64_t>& counts) {
  std::vector<uint64_t> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); i++) d[i] = d[i - 1] + counts[i - 1];
  return d;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                                   std::vector<int64_t>& output_split_sizes,
                                                                   std::vector<int64_t>& input_split_sizes,
                                                                   const c10d::AllToAllOptions& opts) {
  check_cpu(input, "all_to_all_single");
  check_cpu(output, "all_to_all_single");
  if (input.scalar_type() != output.scalar_type()) invalid("all_to_all_single: input and output types differ");
  at::Tensor in = dense(input), out = dense(output);
  auto work = make_work(OpType::ALLTOALL_BASE, {output});
  work->finish = copy_back(out, output);
  if (output_split_sizes.empty() && input_split_sizes.empty()) {
    if (in.numel() != out.numel() || in.numel() % size_ != 0)
      invalid("all_to_all_single: input and output need the same number of elements, a multiple of the group size");
    work->keep = {in, out};
    const hccn_datatype dt = datatype_of(in);
    const uint64_t n = count_of(in) / uint64_t(size_);
    return run(work, opts.asyncOp, [&](hccn_stream* s) {
      check(api().hccn_alltoall(in.data_ptr(), out.data_ptr(), n, dt, comm_, s), comm_);
    });
  }
  return alltoallv(in, counts_of(in, input_split_sizes, size_, "the input"), out,
                   counts_of(out, output_split_sizes, size_, "the output"), work, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  if (outputs.size() != size_t(size_) || inputs.size() != size_t(size_))
    invalid("all_to_all needs " + std::to_string(size_) + " input and output tensors");
  std::vector<uint64_t> sc, rc;
  int64_t total = 0;
  for (auto& t : inputs) {
    check_cpu(t, "all_to_all");
    sc.push_back(count_of(t));
  }
  for (auto& t : outputs) {
    check_cpu(t, "all_to_all");
    if (t.scalar_type() != inputs[0].scalar_type()) invalid("all_to_all: input and output types differ");
    rc.push_back(count_of(t));
    total += t.numel();
  }
  at::Tensor flat_in = flat_copy(inputs);
  at::Tensor flat_out = at::empty({total}, flat_in.options());
  auto work = make_work(OpType::ALLTOALL, outputs);
  std::vector<at::Tensor> outs = outputs;
  work->finish = [flat_out, outs]() mutable { unflatten_into(flat_out, outs); };
  return alltoallv(flat_in, sc, flat_out, rc, work, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::alltoallv(const at::Tensor& in, const std::vector<uint64_t>& sc,
                                                           const at::Tensor& out, const std::vector<uint64_t>& rc,
                                                           c10::intrusive_ptr<WorkHCCN> work, bool async) {
  work->keep.push_back(in);
  work->keep.push_back(out);
  // The count and displacement arrays must outlive a queued operation: they live in the work.
  const size_t n = size_t(size_);
  std::vector<uint64_t> arrays;
  for (const auto* v : {&sc, &rc}) arrays.insert(arrays.end(), v->begin(), v->end());
  for (const auto* v : {&sc, &rc}) {
    auto d = displacements(*v);
    arrays.insert(arrays.end(), d.begin(), d.end());
  }
  work->scratch.resize(arrays.size() * sizeof(uint64_t));
  std::memcpy(work->scratch.data(), arrays.data(), work->scratch.size());
  const uint64_t* a = reinterpret_cast<const uint64_t*>(work->scratch.data());
  const hccn_datatype dt = datatype_of(in);
  return run(work, async, [&](hccn_stream* s) {
    check(api().hccn_alltoallv(in.data_ptr(), a, a + 2 * n, out.data_ptr(), a + n, a + 3 * n, dt, comm_, s), comm_);
  });
}

}  // namespace hccn_torch
