// ProcessGroupHCCN's engine (how an operation is issued and completed), its life cycle, and the
// groups made from it. The collectives are in collectives.cpp, send and receive in p2p.cpp.
#include "backend.h"

#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>

namespace hccn_torch {

namespace {

// Releases the GIL for a blocking wait if this thread holds it: the stream's thread may need it
// (a Python callback on a future), and must never wait for a thread that waits for it.
class WithoutGil {
 public:
  WithoutGil() : state_(Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~WithoutGil() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace

// One queued submission, owned by its callback.
struct Completion {
  c10::intrusive_ptr<WorkHCCN> work;
  ProcessGroupHCCN* group;
  // An error of the submission itself (an operation refused after others of the same work were
  // queued): the work fails with it whatever the stream says.
  std::exception_ptr submit_error;
};

namespace {
int rank_of(hccn_comm* comm) {
  uint32_t rank = 0;
  check(api().hccn_comm_rank(comm, &rank), comm);
  return int(rank);
}

int size_of(hccn_comm* comm) {
  uint32_t size = 0;
  check(api().hccn_comm_size(comm, &size), comm);
  return int(size);
}
}  // namespace

ProcessGroupHCCN::ProcessGroupHCCN(hccn_comm* comm, bool owned, std::chrono::milliseconds timeout)
    : Backend(rank_of(comm), size_of(comm)), comm_(comm), owned_(owned),
      options_(c10::make_intrusive<Options>("hccn", timeout)) {
  recv_streams_.assign(size_t(size_), nullptr);
  stash_.resize(size_t(size_));
}

ProcessGroupHCCN::~ProcessGroupHCCN() {
  try {
    close(false);
  } catch (...) {
    // A destructor has no one to tell; shutdown() reports the same errors when called.
  }
}

c10::intrusive_ptr<ProcessGroupHCCN> ProcessGroupHCCN::init_rank(const std::string& unique_id, int rank, int size,
                                                                 std::chrono::milliseconds timeout) {
  hccn_unique_id id{};
  if (unique_id.size() != sizeof(id.internal))
    invalid("a unique id has " + std::to_string(sizeof(id.internal)) + " bytes, got " +
            std::to_string(unique_id.size()));
  std::copy(unique_id.begin(), unique_id.end(), id.internal);
  if (rank < 0 || size <= 0 || rank >= size)
    invalid("rank " + std::to_string(rank) + " of " + std::to_string(size) + " is out of range");
  hccn_comm* comm = nullptr;
  check(api().hccn_comm_init_rank(&comm, uint32_t(size), &id, uint32_t(rank)), nullptr);
  return c10::make_intrusive<ProcessGroupHCCN>(comm, true, timeout);
}

// -- issuing and completing ---------------------------------------------------------------------

c10::intrusive_ptr<WorkHCCN> ProcessGroupHCCN::make_work(c10d::OpType type, std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<WorkHCCN>(rank_, type, std::move(outputs));
}

void ProcessGroupHCCN::check_open() const {
  if (closed_) invalid("the process group was shut down");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::run(c10::intrusive_ptr<WorkHCCN> work, bool async, Issue issue) {
  drop_retired();
  std::lock_guard<std::mutex> g(submit_mutex_);
  check_open();
  seq_++;
  if (async || work->host_step || pending_.load(std::memory_order_acquire) != 0)
    return enqueue_locked(main_stream(), std::move(work), issue);
  // The caller waits at once and the group is idle: run it here, without a thread hand-off.
  issue(nullptr);
  std::exception_ptr error;
  if (work->finish) {
    try {
      c10::AutoGradMode no_grad(false);
      work->finish();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return done_here(std::move(work), c10d::OpType::UNKNOWN, {});
}

// Done already, and the caller was going to wait at once: no Work, as c10d allows for operations
// a backend completed itself (torch's Python API then skips wait()), unless a completion hook
// needs one to name the operation by.
c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::done_here(c10::intrusive_ptr<WorkHCCN> work, c10d::OpType type,
                                                           const std::vector<at::Tensor>& outputs) {
  if (!any_completion_hook_.load(std::memory_order_acquire)) return {};
  if (!work) work = make_work(type, outputs);
  work->complete(nullptr);
  fire_completion_hooks(*work);
  return work;
}

void ProcessGroupHCCN::fire_completion_hooks(const WorkHCCN& work) const {
  std::shared_ptr<const CompletionHooks> hooks;
  {
    std::lock_guard<std::mutex> g(hooks_mutex_);
    hooks = completion_hooks_;
  }
  if (!hooks) return;
  c10d::CompletionHookArgs args;
  args.completionKey = work.getCompletionKey();
  for (const auto& entry : *hooks) {
    try {
      entry.second(args);
    } catch (...) {
      // A hook's failure is its own; the operation succeeded.
    }
  }
}

void ProcessGroupHCCN::registerCompletionHook(int64_t hook_id, c10d::CompletionHook hook) {
  std::lock_guard<std::mutex> g(hooks_mutex_);
  auto next = std::make_shared<CompletionHooks>(completion_hooks_ ? *completion_hooks_ : CompletionHooks{});
  next->emplace_back(hook_id, std::move(hook));
  completion_hooks_ = std::move(next);
  any_completion_hook_.store(true, std::memory_order_release);
}

void ProcessGroupHCCN::unregisterCompletionHook(int64_t hook_id) {
  std::lock_guard<std::mutex> g(hooks_mutex_);
  if (!completion_hooks_) return;
  auto next = std::make_shared<CompletionHooks>(*completion_hooks_);
  next->erase(std::remove_if(next->begin(), next->end(), [&](const auto& e) { return e.first == hook_id; }),
              next->end());
  any_completion_hook_.store(!next->empty(), std::memory_order_release);
  completion_hooks_ = next->empty() ? nullptr : std::shared_ptr<const CompletionHooks>(std::move(next));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::run_direct(c10d::OpType type, const std::vector<at::Tensor>& outputs,
                                                            bool async, Issue issue) {
  drop_retired();
  std::lock_guard<std::mutex> g(submit_mutex_);
  check_open();
  seq_++;
  if (async || pending_.load(std::memory_order_acquire) != 0)
    return enqueue_locked(main_stream(), make_work(type, outputs), issue);
  issue(nullptr);
  return done_here(nullptr, type, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::enqueue_on(int recv_from, c10::intrusive_ptr<WorkHCCN> work,
                                                            Issue issue) {
  drop_retired();
  std::lock_guard<std::mutex> g(submit_mutex_);
  check_open();
  seq_++;
  return enqueue_locked(recv_from < 0 ? main_stream() : recv_stream(recv_from), std::move(work), issue);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::enqueue_locked(hccn_stream* stream, c10::intrusive_ptr<WorkHCCN> work,
                                                                Issue issue) {
  pending_.fetch_add(1, std::memory_order_acq_rel);
  auto done = std::make_unique<Completion>(Completion{work, this, nullptr});
  try {
    issue(stream);
  } catch (...) {
    done->submit_error = std::current_exception();
  }
  hccn_result r = api().hccn_stream_add_callback(stream, &ProcessGroupHCCN::on_done, done.get());
  if (r != HCCN_SUCCESS) {
    // Nobody will call back: wait here for what was queued and finish the work now.
    Error e = error_of(r, comm_);
    {
      WithoutGil nogil;
      api().hccn_stream_synchronize(stream);
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
    work->complete(std::make_exception_ptr(e));
    throw e;
  }
  std::exception_ptr submit_error = done->submit_error;
  done.release();  // the callback owns it now
  if (submit_error) std::rethrow_exception(submit_error);
  return work;
}

void ProcessGroupHCCN::on_done(hccn_result status, void* completion) noexcept {
  std::unique_ptr<Completion> done(static_cast<Completion*>(completion));
  ProcessGroupHCCN* group = done->group;
  WorkHCCN& work = *done->work;
  std::exception_ptr error = done->submit_error;
  try {
    if (!error && status != HCCN_SUCCESS) error = std::make_exception_ptr(error_of(status, group->comm_));
    if (!error && work.host_step) work.host_step();
    if (!error && work.finish) {
      c10::AutoGradMode no_grad(false);
      work.finish();
    }
  } catch (...) {
    error = std::current_exception();
  }
  work.host_step = nullptr;
  work.finish = nullptr;
  // Before completion: whoever wakes up may issue its next operation on its own thread at once.
  group->pending_.fetch_sub(1, std::memory_order_acq_rel);
  try {
    work.complete(error);
  } catch (...) {
    // A future callback's exception is the callback's own (c10 futures keep their errors).
  }
  if (!error) group->fire_completion_hooks(work);
  std::lock_guard<std::mutex> g(group->retired_mutex_);
  group->retired_.push_back(std::move(done->work));
  group->any_retired_.store(true, std::memory_order_release);
}

void ProcessGroupHCCN::drop_retired() {
  if (!any_retired_.load(std::memory_order_acquire)) return;
  std::vector<c10::intrusive_ptr<WorkHCCN>> old;
  {
    std::lock_guard<std::mutex> g(retired_mutex_);
    any_retired_.store(false, std::memory_order_relaxed);
    old.swap(retired_);
  }
  // Destroyed here, on the caller's thread.
}

hccn_stream* ProcessGroupHCCN::main_stream() {
  if (stream_ == nullptr) check(api().hccn_stream_create(&stream_), comm_);
  return stream_;
}

hccn_stream* ProcessGroupHCCN::recv_stream(int src) {
  hccn_stream*& s = recv_streams_.at(size_t(src));
  if (s == nullptr) check(api().hccn_stream_create(&s), comm_);
  return s;
}

void ProcessGroupHCCN::wait_queued() {
  WithoutGil nogil;
  if (stream_ != nullptr) api().hccn_stream_synchronize(stream_);
  for (hccn_stream* s : recv_streams_)
    if (s != nullptr) api().hccn_stream_synchronize(s);
}

// Waits outside submit_mutex_: a future's callback, run by the stream's thread, may issue the
// next operation (DDP's PowerSGD hook does).
void ProcessGroupHCCN::synchronize() {
  check_open();
  wait_queued();
}

// -- life cycle -----------------------------------------------------------------------------------

void ProcessGroupHCCN::close(bool abort_comm) {
  std::vector<hccn_stream*> streams;
  hccn_comm* comm = nullptr;
  bool owned = false;
  {
    std::lock_guard<std::mutex> g(submit_mutex_);
    if (closed_) return;
    closed_ = true;
    streams = recv_streams_;
    streams.push_back(stream_);
    stream_ = nullptr;
    std::fill(recv_streams_.begin(), recv_streams_.end(), nullptr);
    comm = comm_;
    owned = owned_;
  }
  {
    WithoutGil nogil;
    // Aborting first makes what is queued fail at once instead of waiting for peers.
    if (abort_comm && owned) {
      api().hccn_comm_abort(comm);
      owned = false;
    }
    // Destroying a stream waits for its queue, callbacks included.
    for (hccn_stream* s : streams)
      if (s != nullptr) api().hccn_stream_destroy(s);
    if (owned) api().hccn_comm_destroy(comm);
  }
  drop_retired();
}

void ProcessGroupHCCN::shutdown() { close(false); }

void ProcessGroupHCCN::abort() { close(true); }

// -- shareable memory ---------------------------------------------------------------------------

at::Tensor ProcessGroupHCCN::allocateTensor(long size, at::TensorOptions options) {
  if (options.device().type() != at::kCPU) invalid("allocateTensor: the hccn backend allocates CPU tensors only");
  if (size < 0) invalid("allocateTensor: a negative size");
  const uint64_t bytes = uint64_t(size) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  if (bytes == 0) return at::empty({size}, options);
  void* p = nullptr;
  check(api().hccn_mem_alloc(&p, bytes), comm_);
  // Freed when the last tensor over it goes; operations keep their tensors until they are done.
  return at::from_blob(p, {size}, [](void* q) { api().hccn_mem_free(q); }, options);
}

// -- groups ---------------------------------------------------------------------------------------

c10::intrusive_ptr<ProcessGroupHCCN> ProcessGroupHCCN::adopt_new(hccn_comm* comm) {
  try {
    return c10::make_intrusive<ProcessGroupHCCN>(comm, true, options_->timeout);
  } catch (...) {
    api().hccn_comm_destroy(comm);
    throw;
  }
}

c10::intrusive_ptr<ProcessGroupHCCN> ProcessGroupHCCN::new_group(const std::vector<int64_t>& ranks) {
  std::vector<uint32_t> members;
  for (int64_t r : ranks) {
    if (r < 0 || r >= size_) invalid("new_group: rank " + std::to_string(r) + " is not in this group");
    members.push_back(uint32_t(r));
  }
  if (std::find(members.begin(), members.end(), uint32_t(rank_)) == members.end())
    invalid("new_group: only the members call it, and this rank is not among them");
  synchronize();
  std::lock_guard<std::mutex> g(submit_mutex_);
  check_open();
  hccn_comm* comm = nullptr;
  {
    WithoutGil nogil;
    check(api().hccn_new_group(comm_, members.data(), uint32_t(members.size()), &comm), comm_);
  }
  return adopt_new(comm);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupHCCN::split(const c10::intrusive_ptr<c10d::Store>& /*store*/,
                                                          const std::vector<int>& ranks,
                                                          const c10::intrusive_ptr<Options>& /*opts*/) {
  if (std::find(ranks.begin(), ranks.end(), rank_) == ranks.end()) return nullptr;
  return new_group(std::vector<int64_t>(ranks.begin(), ranks.end()));
}

std::vector<uint32_t> ProcessGroupHCCN::failed_ranks() const {
  if (closed_) return {};
  std::vector<uint32_t> ranks(static_cast<size_t>(size_));
  uint32_t n = 0;
  check(api().hccn_comm_failed_ranks(comm_, ranks.data(), uint32_t(ranks.size()), &n), comm_);
  ranks.resize(std::min<size_t>(n, ranks.size()));
  return ranks;
}

uint64_t ProcessGroupHCCN::epoch() const {
  check_open();
  uint64_t e = 0;
  check(api().hccn_comm_epoch(comm_, &e), comm_);
  return e;
}

int64_t ProcessGroupHCCN::broadcast_value(int64_t value) {
  synchronize();
  std::lock_guard<std::mutex> g(submit_mutex_);
  check_open();
  WithoutGil nogil;
  check(api().hccn_broadcast(&value, 1, HCCN_INT64, 0, comm_, nullptr), comm_);
  return value;
}

c10::intrusive_ptr<ProcessGroupHCCN> ProcessGroupHCCN::shrink_comm() {
  std::lock_guard<std::mutex> g(submit_mutex_);
  check_open();
  hccn_comm* comm = nullptr;
  {
    WithoutGil nogil;
    check(api().hccn_comm_shrink(comm_, &comm), comm_);
  }
  auto next = adopt_new(comm);
  // Who is who in the old numbering: every survivor says its old rank.
  std::vector<int64_t> old(size_t(next->size_), 0);
  int64_t mine = rank_;
  {
    WithoutGil nogil;
    check(api().hccn_allgather(&mine, old.data(), 1, HCCN_INT64, comm, nullptr), comm);
  }
  next->origin_ranks_ = std::move(old);
  return next;
}

c10::intrusive_ptr<ProcessGroupHCCN> ProcessGroupHCCN::rebuild_comm(uint32_t timeout_ms) {
  std::lock_guard<std::mutex> g(submit_mutex_);
  check_open();
  hccn_comm* comm = nullptr;
  {
    WithoutGil nogil;
    check(api().hccn_comm_rebuild(comm_, timeout_ms, &comm), comm_);
  }
  return adopt_new(comm);
}

void ProcessGroupHCCN::adopt_comm(ProcessGroupHCCN& next) {
  if (&next == this) return;
  if (next.rank_ != rank_ || next.size_ != size_)
    invalid("adopt_comm: rank " + std::to_string(next.rank_) + " of " + std::to_string(next.size_) +
            " does not match this group's " + std::to_string(rank_) + " of " + std::to_string(size_));
  synchronize();
  next.synchronize();
  std::scoped_lock g(submit_mutex_, next.submit_mutex_);
  check_open();
  next.check_open();
  hccn_comm* old = comm_;
  const bool old_owned = owned_;
  comm_ = next.comm_;
  owned_ = next.owned_;
  next.owned_ = false;
  next.closed_ = true;
  for (auto& tags : stash_) tags.clear();
  if (old_owned) {
    WithoutGil nogil;
    api().hccn_comm_destroy(old);
  }
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupHCCN::shrink(const std::vector<int64_t>& ranks_to_exclude,
                                                           int /*shrink_flags*/,
                                                           const c10::intrusive_ptr<Options>& /*opts_override*/) {
  std::vector<int64_t> keep;
  for (int64_t r = 0; r < size_; r++)
    if (std::find(ranks_to_exclude.begin(), ranks_to_exclude.end(), r) == ranks_to_exclude.end()) keep.push_back(r);
  if (failed_ranks().empty()) return new_group(keep);
  auto next = shrink_comm();
  if (next->origin_ranks_ != keep) {
    std::string got;
    for (int64_t r : next->origin_ranks_) got += " " + std::to_string(r);
    next->shutdown();
    invalid("shrink_group: the survivors hccn agreed on are [" + got +
            " ], which is not this group without ranks_to_exclude");
  }
  return next;
}

}  // namespace hccn_torch
