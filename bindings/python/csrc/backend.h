// ProcessGroupHCCN: torch.distributed's "hccn" backend, a c10d::Backend over one hccn
// communicator, for dense CPU tensors.
//
// How an operation runs:
// - Synchronously on the caller's thread (stream NULL) when the caller waits at once
//   (opts.asyncOp is false: dist.all_reduce(t) without async_op) and nothing of this group is
//   queued: no thread hand-off, and no Work (null, which c10d allows for an operation the
//   backend completed itself). An operation on tensors hccn takes as they are (run_direct) does
//   not even make one: no allocation, no std::function, one uncontended lock. While a
//   completion hook is registered (torch's FlightRecorderHook registers one), it returns a
//   completed Work instead: the recorder retires an entry through its op's Work, and one left
//   without would read as never finished in every dump.
// - Otherwise queued on the group's hccn stream, followed by hccn_stream_add_callback: the
//   stream's thread completes the Work and its future when the operation is done. No thread per
//   operation; wait() sleeps on a condition variable. While the stream's thread waits for peers,
//   hccn's own waits apply: a short spin (20 us, only when every local rank has a core), then a
//   futex sleep, so a wait during DDP's backward does not keep a core from autograd.
// - Receives run on a stream per source (tags are matched there, see p2p.cpp), so an irecv that
//   waits does not hold up the sends and collectives queued after it.
#pragma once

#include "hccn_api.h"
#include "work.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <c10/util/FunctionRef.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace hccn_torch {

class ProcessGroupHCCN : public c10d::Backend {
 public:
  // Takes `comm`; destroys it at shutdown when `owned` (a communicator the Python package owns,
  // the world under hccnrun, is only borrowed).
  ProcessGroupHCCN(hccn_comm* comm, bool owned, std::chrono::milliseconds timeout);
  ~ProcessGroupHCCN() override;

  // hccn_comm_init_rank with the 128 bytes of an hccn_unique_id (rank 0's, shared by the caller).
  static c10::intrusive_ptr<ProcessGroupHCCN> init_rank(const std::string& unique_id, int rank, int size,
                                                        std::chrono::milliseconds timeout);

  const std::string getBackendName() const override { return "hccn"; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  bool supportsSplitting() const override { return true; }
  bool supportsShrinking() const override { return true; }
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  // Tensors in hccn's shareable memory (hccn_mem_alloc): a peer on this host reads them with
  // plain loads instead of process_vm_readv. DDP allocates its gradient buckets here (unless
  // DDP_DISABLE_COMM_MEM is set), FSDP2 its all-gather buffers when asked to.
  bool supportsTensorAlloc(c10::DeviceIndex device) override { return device < 0; }
  // Called with the Work's completion key when an operation succeeds (Hooks.hpp): on the caller's
  // thread for one run there, on the stream's thread for one queued.
  bool supportsCompletionHooks() const override { return true; }
  void registerCompletionHook(int64_t hook_id, c10d::CompletionHook hook) override;
  void unregisterCompletionHook(int64_t hook_id) override;
  at::Tensor allocateTensor(long size, at::TensorOptions options) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather_single(at::Tensor& output, at::Tensor& input,
                                               const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                   std::vector<int64_t>& output_split_sizes,
                                                   std::vector<int64_t>& input_split_sizes,
                                                   const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;

  // torch.distributed.split_group: members get a group of `ranks` (new rank = index in it).
  c10::intrusive_ptr<Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                    const c10::intrusive_ptr<Options>& opts) override;
  // torch.distributed.shrink_group: without failed members a group of the others; with failed
  // members hccn's agreement (hccn_comm_shrink), which must exclude exactly `ranks_to_exclude`.
  c10::intrusive_ptr<Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                     const c10::intrusive_ptr<Options>& opts_override) override;

  // Waits for the queued work, then frees the streams and, when owned, the communicator.
  void shutdown() override;
  // Fails what is queued now (hccn_comm_abort on an owned communicator), then as shutdown.
  void abort() override;

  // For hccn.torch: a group of `ranks` (members call it), hccn's shrink and rebuild (survivors
  // call them; rebuild also admits replacement processes), and what they are based on.
  c10::intrusive_ptr<ProcessGroupHCCN> new_group(const std::vector<int64_t>& ranks);  // waits for the queue
  c10::intrusive_ptr<ProcessGroupHCCN> shrink_comm();
  c10::intrusive_ptr<ProcessGroupHCCN> rebuild_comm(uint32_t timeout_ms);
  std::vector<uint32_t> failed_ranks() const;
  uint64_t epoch() const;
  uintptr_t comm_handle() const { return reinterpret_cast<uintptr_t>(comm_); }
  // Moves this group to `next`'s communicator (same rank and size: a rebuild that changed no
  // membership), freeing its own when owned; `next` is closed. Receives stashed from the old
  // communicator are dropped.
  void adopt_comm(ProcessGroupHCCN& next);
  // The members' ranks in the communicator this one was shrunk from (empty if not shrunk).
  const std::vector<int64_t>& origin_ranks() const { return origin_ranks_; }
  // Broadcasts `value` from rank 0 on the communicator, blocking (hccn.torch's handshakes).
  int64_t broadcast_value(int64_t value);
  // Waits for everything queued on this group.
  void synchronize();

 private:
  // The hccn calls of one operation, on a stream (NULL: run them here). Called before the
  // function it is given to returns, never kept.
  using Issue = c10::function_ref<void(hccn_stream*)>;
  friend struct Completion;

  c10::intrusive_ptr<WorkHCCN> make_work(c10d::OpType type, std::vector<at::Tensor> outputs);
  // What the caller gets for an operation done on its thread: nothing, or a completed Work
  // (made from `type` and `outputs` unless given) while completion hooks are registered.
  c10::intrusive_ptr<c10d::Work> done_here(c10::intrusive_ptr<WorkHCCN> work, c10d::OpType type,
                                           const std::vector<at::Tensor>& outputs);
  void fire_completion_hooks(const WorkHCCN& work) const;
  // Runs `issue` now on this thread (stream NULL) when the caller waits at once and nothing is
  // queued (and returns no Work), else queues it on the group's stream.
  c10::intrusive_ptr<c10d::Work> run(c10::intrusive_ptr<WorkHCCN> work, bool async, Issue issue);
  // As run() for an operation that needs nothing of a Work but its outputs (no staging copies,
  // no host step): the Work is made only when the operation is queued.
  c10::intrusive_ptr<c10d::Work> run_direct(c10d::OpType type, const std::vector<at::Tensor>& outputs, bool async,
                                            Issue issue);
  // Queues `issue` on the group's stream, or on the receive stream of `recv_from` (>= 0).
  c10::intrusive_ptr<c10d::Work> enqueue_on(int recv_from, c10::intrusive_ptr<WorkHCCN> work, Issue issue);
  // Queues `issue` on `stream`, then the callback that completes `work`; submit_mutex_ is held.
  c10::intrusive_ptr<c10d::Work> enqueue_locked(hccn_stream* stream, c10::intrusive_ptr<WorkHCCN> work, Issue issue);
  static void on_done(hccn_result status, void* completion) noexcept;
  hccn_stream* main_stream();
  hccn_stream* recv_stream(int src);
  void check_open() const;
  // Drops the references of completed works on the caller's thread (see retire_).
  void drop_retired();
  void close(bool abort_comm);
  void wait_queued();
  c10::intrusive_ptr<ProcessGroupHCCN> adopt_new(hccn_comm* comm);
  c10::intrusive_ptr<c10d::Work> alltoallv(const at::Tensor& in, const std::vector<uint64_t>& send_counts,
                                           const at::Tensor& out, const std::vector<uint64_t>& recv_counts,
                                           c10::intrusive_ptr<WorkHCCN> work, bool async);
  void receive_matching(int src, int64_t tag, void* dst, uint64_t bytes);
  void check_peer(int peer, const char* what) const;
  hccn_reduce_op reduce_op(const c10d::ReduceOp& op, const at::Tensor& t) const;

  hccn_comm* comm_;  // stays set after close: the handle table refuses it once destroyed
  bool owned_;
  c10::intrusive_ptr<Options> options_;
  std::vector<int64_t> origin_ranks_;
  std::mutex submit_mutex_;  // operations are issued in program order, one thread at a time
  hccn_stream* stream_ = nullptr;
  std::vector<hccn_stream*> recv_streams_;
  // Submissions whose completion callback has not finished, on any of the streams.
  std::atomic<int64_t> pending_{0};
  std::atomic<uint64_t> seq_{0};
  bool closed_ = false;
  // Completed works whose last references the stream's thread must not drop: a tensor made in
  // Python needs the GIL when its last C++ reference goes, and the stream's thread must never
  // wait for the GIL. The caller's thread drops them at its next operation or at shutdown.
  std::mutex retired_mutex_;
  std::vector<c10::intrusive_ptr<WorkHCCN>> retired_;
  std::atomic<bool> any_retired_{false};  // retired_ is not empty (read without the lock)
  // Completion hooks by id. Replaced, never changed in place, so that a completing thread calls
  // a snapshot without the lock: a hook's owner may unregister it while holding its own lock.
  using CompletionHooks = std::vector<std::pair<int64_t, c10d::CompletionHook>>;
  mutable std::mutex hooks_mutex_;
  std::shared_ptr<const CompletionHooks> completion_hooks_;
  std::atomic<bool> any_completion_hook_{false};
  // Messages that arrived before the receive of their tag: [source][tag], in arrival order.
  // Each source's entry is touched only by that source's receive stream.
  std::vector<std::unordered_map<int64_t, std::deque<std::vector<uint8_t>>>> stash_;
};

}  // namespace hccn_torch
