// hccn.hpp: a header-only C++17 layer over hccn's C ABI (include/hccn.h).
//
//   hccn::Comm comm = hccn::Comm::from_env();          // the world that hccnrun started
//   std::vector<float> grad(n, 1.0f);
//   comm.allreduce(grad, hccn::ReduceOp::Avg);          // in place, blocking
//
//   hccn::Stream stream;                                // ordered queue with its own thread
//   comm.allreduce(grad.data(), grad.data(), n, hccn::ReduceOp::Sum, stream);
//   stream.synchronize();                               // throws the first error of queued work
//
// - Ownership is RAII: Comm, Stream, Event and Bucket free their handle in the destructor and
//   are move-only. A Comm's destructor waits for its queued work (hccn_comm_destroy);
//   Comm::abort() fails it at once instead.
// - Every failing call throws hccn::Error, which carries the hccn_result and the message of
//   hccn_get_last_error() read on the failing thread right after the call.
// - Element types map to hccn_datatype through hccn::datatype_of<T>: the fixed-width integers,
//   float, double, and hccn::fp16 / hccn::bf16 (16-bit storage types; hccn reduces them in f32).
// - Collectives take an optional stream (a Stream, or nothing for a blocking call); with a
//   stream the buffers must stay valid until the stream has run the operation.
// Conventions of the underlying calls (in-place rules, errors, threads): docs/c-api.md.

#ifndef HCCN_HPP
#define HCCN_HPP

// Below C++17 the standard headers fail first (std::optional, if constexpr) with messages that
// do not say why; say it here and skip the rest. MSVC reports the standard in _MSVC_LANG.
#if defined(_MSVC_LANG) && _MSVC_LANG > __cplusplus
#define HCCN_HPP_CPLUSPLUS _MSVC_LANG
#else
#define HCCN_HPP_CPLUSPLUS __cplusplus
#endif
#if HCCN_HPP_CPLUSPLUS < 201703L
#error "hccn.hpp needs C++17 or later (compile with -std=c++17); from C or older C++, include hccn.h"
#else

#include <hccn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace hccn {

// ---------------------------------------------------------------------------------------------
// Errors

class Error : public std::runtime_error {
 public:
  Error(hccn_result code, const std::string& what, std::string detail)
      : std::runtime_error(compose(code, what, detail)), code_(code), detail_(std::move(detail)) {}

  // The hccn_result the C call returned.
  hccn_result code() const noexcept { return code_; }
  // hccn_get_last_error() of the failing call ("" when the library gave none).
  const std::string& detail() const noexcept { return detail_; }

 private:
  static std::string compose(hccn_result code, const std::string& what, const std::string& detail) {
    std::string s = what + ": " + hccn_get_error_string(code) + " (" + std::to_string(int(code)) + ")";
    if (!detail.empty()) s += ": " + detail;
    return s;
  }

  hccn_result code_;
  std::string detail_;
};

// Throws hccn::Error unless `r` is HCCN_SUCCESS. `what` names the call for the message.
inline void check(hccn_result r, const char* what) {
  if (r != HCCN_SUCCESS) throw Error(r, what, hccn_get_last_error());
}

// The library's version as "MAJOR.MINOR.PATCH".
inline std::string version() {
  int32_t v = 0;
  check(hccn_get_version(&v), "hccn_get_version");
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

// ---------------------------------------------------------------------------------------------
// Types

enum class ReduceOp : int {
  Sum = HCCN_SUM,
  Prod = HCCN_PROD,
  Max = HCCN_MAX,
  Min = HCCN_MIN,
  Avg = HCCN_AVG,
};

// 16-bit floating-point storage (IEEE half / bfloat16): hccn reduces these in f32.
struct fp16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

// datatype_of<T>::value is the hccn_datatype of T; an unmapped T does not compile.
template <class T, class = void>
struct datatype_of;

#define HCCN_HPP_MAP(T, DT) \
  template <>               \
  struct datatype_of<T> : std::integral_constant<hccn_datatype, DT> {}
HCCN_HPP_MAP(int8_t, HCCN_INT8);
HCCN_HPP_MAP(int16_t, HCCN_INT16);
HCCN_HPP_MAP(int32_t, HCCN_INT32);
HCCN_HPP_MAP(int64_t, HCCN_INT64);
HCCN_HPP_MAP(uint8_t, HCCN_UINT8);
HCCN_HPP_MAP(uint16_t, HCCN_UINT16);
HCCN_HPP_MAP(uint32_t, HCCN_UINT32);
HCCN_HPP_MAP(uint64_t, HCCN_UINT64);
HCCN_HPP_MAP(float, HCCN_FP32);
HCCN_HPP_MAP(double, HCCN_FP64);
HCCN_HPP_MAP(fp16, HCCN_FP16);
HCCN_HPP_MAP(bf16, HCCN_BF16);
#undef HCCN_HPP_MAP

// `long long` and `long` are distinct types, and only one of them is int64_t: map the other by
// its size so that std::vector<long long> works everywhere.
template <class T>
struct datatype_of<T, std::enable_if_t<(std::is_same_v<T, long> || std::is_same_v<T, long long> ||
                                        std::is_same_v<T, unsigned long> || std::is_same_v<T, unsigned long long>) &&
                                       !std::is_same_v<T, int64_t> && !std::is_same_v<T, uint64_t>>>
    : std::integral_constant<hccn_datatype, std::is_signed_v<T> ? HCCN_INT64 : HCCN_UINT64> {
  static_assert(sizeof(T) == 8, "hccn maps long/long long only where they are 64 bits");
};

template <class T>
inline constexpr hccn_datatype datatype_v = datatype_of<std::remove_cv_t<T>>::value;

// A unique id: the bytes rank 0 creates and every rank passes to Comm::init_rank.
using UniqueId = hccn_unique_id;

inline UniqueId unique_id() {
  UniqueId id{};
  check(hccn_get_unique_id(&id), "hccn_get_unique_id");
  return id;
}

// ---------------------------------------------------------------------------------------------
// Stream and Event

class Stream {
 public:
  Stream() { check(hccn_stream_create(&s_), "hccn_stream_create"); }
  ~Stream() {
    if (s_) hccn_stream_destroy(s_);  // waits for queued work; errors were for synchronize()
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      if (s_) hccn_stream_destroy(s_);
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }

  // Waits for everything queued; throws the first error of the queued work.
  void synchronize() { check(hccn_stream_synchronize(s_), "hccn_stream_synchronize"); }
  // True when all queued work is done, false while some is pending; throws its error.
  bool query() {
    hccn_result r = hccn_stream_query(s_);
    if (r == HCCN_IN_PROGRESS) return false;
    check(r, "hccn_stream_query");
    return true;
  }
  hccn_stream* get() const noexcept { return s_; }

 private:
  hccn_stream* s_ = nullptr;
};

// Where a collective runs: a Stream, or blocking (the default).
class StreamRef {
 public:
  StreamRef() noexcept = default;
  StreamRef(std::nullptr_t) noexcept {}
  StreamRef(Stream& s) noexcept : s_(s.get()) {}
  hccn_stream* get() const noexcept { return s_; }

 private:
  hccn_stream* s_ = nullptr;
};

class Event {
 public:
  Event() { check(hccn_event_create(&e_), "hccn_event_create"); }
  ~Event() {
    if (e_) hccn_event_destroy(e_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      if (e_) hccn_event_destroy(e_);
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }

  // Marks the work queued on `stream` so far (no stream: complete at once).
  void record(StreamRef stream = {}) { check(hccn_event_record(e_, stream.get()), "hccn_event_record"); }
  // True once the marked work is done; throws its error.
  bool query() {
    hccn_result r = hccn_event_query(e_);
    if (r == HCCN_IN_PROGRESS) return false;
    check(r, "hccn_event_query");
    return true;
  }
  void synchronize() { check(hccn_event_synchronize(e_), "hccn_event_synchronize"); }
  hccn_event* get() const noexcept { return e_; }

 private:
  hccn_event* e_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Communicator

namespace detail {
// Anything with contiguous data() and size() (std::vector, std::array, std::span, ...).
template <class C, class = void>
struct is_contiguous : std::false_type {};
template <class C>
struct is_contiguous<C, std::void_t<decltype(std::declval<C&>().data()), decltype(std::declval<C&>().size())>>
    : std::true_type {};
template <class C>
using elem_t = std::remove_pointer_t<decltype(std::declval<C&>().data())>;
}  // namespace detail

class Comm {
 public:
  // Joins the world described by the hccnrun environment (HCCN_RANK, HCCN_WORLD_SIZE, ...).
  static Comm from_env() {
    hccn_comm* c = nullptr;
    check(hccn_init_from_env(&c), "hccn_init_from_env");
    return Comm(c);
  }
  // Joins the communicator of `nranks` that `id` (shared out of band) describes, as `rank`.
  static Comm init_rank(uint32_t nranks, const UniqueId& id, uint32_t rank) {
    hccn_comm* c = nullptr;
    check(hccn_comm_init_rank(&c, nranks, &id, rank), "hccn_comm_init_rank");
    return Comm(c);
  }
  // Takes ownership of a handle from the C API.
  explicit Comm(hccn_comm* c) noexcept : c_(c) {}

  ~Comm() {
    if (c_) hccn_comm_destroy(c_);
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  Comm(Comm&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  Comm& operator=(Comm&& o) noexcept {
    if (this != &o) {
      if (c_) hccn_comm_destroy(c_);
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }

  hccn_comm* get() const noexcept { return c_; }
  // Gives the handle back to the caller, who must destroy it.
  hccn_comm* release() noexcept { return std::exchange(c_, nullptr); }

  uint32_t rank() const {
    uint32_t r = 0;
    check(hccn_comm_rank(c_, &r), "hccn_comm_rank");
    return r;
  }
  uint32_t size() const {
    uint32_t n = 0;
    check(hccn_comm_size(c_, &n), "hccn_comm_size");
    return n;
  }
  uint64_t epoch() const {
    uint64_t e = 0;
    check(hccn_comm_epoch(c_, &e), "hccn_comm_epoch");
    return e;
  }
  // HCCN_SUCCESS while healthy, else the error that broke the communicator.
  hccn_result async_error() const {
    hccn_result e = HCCN_SUCCESS;
    check(hccn_comm_get_async_error(c_, &e), "hccn_comm_get_async_error");
    return e;
  }
  std::vector<uint32_t> failed_ranks() const {
    uint32_t count = 0;
    check(hccn_comm_failed_ranks(c_, nullptr, 0, &count), "hccn_comm_failed_ranks");
    std::vector<uint32_t> ranks(count);
    if (count > 0) {
      check(hccn_comm_failed_ranks(c_, ranks.data(), count, &count), "hccn_comm_failed_ranks");
      ranks.resize(std::min<size_t>(count, ranks.size()));
    }
    return ranks;
  }

  // Fails everything pending now and frees the communicator (this object becomes empty).
  void abort() {
    if (c_) check(hccn_comm_abort(std::exchange(c_, nullptr)), "hccn_comm_abort");
  }
  void revoke() { check(hccn_comm_revoke(c_), "hccn_comm_revoke"); }
  // Survivors' communicator at the next epoch; this one stays valid.
  Comm shrink() {
    hccn_comm* n = nullptr;
    check(hccn_comm_shrink(c_, &n), "hccn_comm_shrink");
    return Comm(n);
  }
  Comm rebuild(uint32_t timeout_ms) {
    hccn_comm* n = nullptr;
    check(hccn_comm_rebuild(c_, timeout_ms, &n), "hccn_comm_rebuild");
    return Comm(n);
  }

  // Collective: ranks with the same color form a communicator ordered by (key, rank); a
  // negative color gives no communicator.
  std::optional<Comm> split(int32_t color, int32_t key) {
    hccn_comm* n = nullptr;
    check(hccn_comm_split(c_, color, key, &n), "hccn_comm_split");
    if (!n) return std::nullopt;
    return Comm(n);
  }
  // Called by the listed ranks only; the new rank is the index in `ranks`.
  Comm new_group(const std::vector<uint32_t>& ranks) {
    hccn_comm* n = nullptr;
    check(hccn_new_group(c_, ranks.data(), uint32_t(ranks.size()), &n), "hccn_new_group");
    return Comm(n);
  }

  // --- collectives on pointers -----------------------------------------------------------

  template <class T>
  void allreduce(const T* send, T* recv, uint64_t count, ReduceOp op = ReduceOp::Sum, StreamRef s = {}) {
    check(hccn_allreduce(send, recv, count, datatype_v<T>, hccn_reduce_op(op), c_, s.get()), "hccn_allreduce");
  }
  template <class T>
  void broadcast(T* buf, uint64_t count, uint32_t root, StreamRef s = {}) {
    check(hccn_broadcast(buf, count, datatype_v<T>, root, c_, s.get()), "hccn_broadcast");
  }
  template <class T>
  void reduce(const T* send, T* recv, uint64_t count, ReduceOp op, uint32_t root, StreamRef s = {}) {
    check(hccn_reduce(send, recv, count, datatype_v<T>, hccn_reduce_op(op), root, c_, s.get()), "hccn_reduce");
  }
  // `recv` holds size() * sendcount elements.
  template <class T>
  void allgather(const T* send, T* recv, uint64_t sendcount, StreamRef s = {}) {
    check(hccn_allgather(send, recv, sendcount, datatype_v<T>, c_, s.get()), "hccn_allgather");
  }
  // `send` holds size() * recvcount elements.
  template <class T>
  void reduce_scatter(const T* send, T* recv, uint64_t recvcount, ReduceOp op = ReduceOp::Sum, StreamRef s = {}) {
    check(hccn_reduce_scatter(send, recv, recvcount, datatype_v<T>, hccn_reduce_op(op), c_, s.get()),
          "hccn_reduce_scatter");
  }
  template <class T>
  void gather(const T* send, T* recv, uint64_t sendcount, uint32_t root, StreamRef s = {}) {
    check(hccn_gather(send, recv, sendcount, datatype_v<T>, root, c_, s.get()), "hccn_gather");
  }
  template <class T>
  void scatter(const T* send, T* recv, uint64_t recvcount, uint32_t root, StreamRef s = {}) {
    check(hccn_scatter(send, recv, recvcount, datatype_v<T>, root, c_, s.get()), "hccn_scatter");
  }
  template <class T>
  void alltoall(const T* send, T* recv, uint64_t count_per_rank, StreamRef s = {}) {
    check(hccn_alltoall(send, recv, count_per_rank, datatype_v<T>, c_, s.get()), "hccn_alltoall");
  }
  template <class T>
  void send(const T* buf, uint64_t count, uint32_t peer, StreamRef s = {}) {
    check(hccn_send(buf, count, datatype_v<T>, peer, c_, s.get()), "hccn_send");
  }
  template <class T>
  void recv(T* buf, uint64_t count, uint32_t peer, StreamRef s = {}) {
    check(hccn_recv(buf, count, datatype_v<T>, peer, c_, s.get()), "hccn_recv");
  }
  void barrier(StreamRef s = {}) { check(hccn_barrier(c_, s.get()), "hccn_barrier"); }

  // --- collectives on contiguous containers (in place where that makes sense) -------------

  template <class C, class = std::enable_if_t<detail::is_contiguous<C>::value>>
  void allreduce(C& buf, ReduceOp op = ReduceOp::Sum, StreamRef s = {}) {
    allreduce(buf.data(), buf.data(), uint64_t(buf.size()), op, s);
  }
  template <class C, class = std::enable_if_t<detail::is_contiguous<C>::value>>
  void broadcast(C& buf, uint32_t root, StreamRef s = {}) {
    broadcast(buf.data(), uint64_t(buf.size()), root, s);
  }
  // Returns size() * send.size() elements, rank r's block at r * send.size().
  template <class T>
  std::vector<T> allgather(const std::vector<T>& send) {
    std::vector<T> out(send.size() * size());
    allgather(send.data(), out.data(), uint64_t(send.size()));
    return out;
  }
  // `send` holds size() blocks of equal length; returns this rank's reduced block.
  template <class T>
  std::vector<T> reduce_scatter(const std::vector<T>& send, ReduceOp op = ReduceOp::Sum) {
    uint32_t n = size();
    if (send.size() % n != 0) {
      throw Error(HCCN_ERROR_INVALID_ARGUMENT, "hccn::Comm::reduce_scatter",
                  "input of " + std::to_string(send.size()) + " elements is not " + std::to_string(n) +
                      " equal blocks");
    }
    std::vector<T> out(send.size() / n);
    reduce_scatter(send.data(), out.data(), uint64_t(out.size()), op);
    return out;
  }

 private:
  hccn_comm* c_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Fusion bucket: many allreduces of one type and op through few collectives (docs/c-api.md).

template <class T>
class Bucket {
 public:
  Bucket(Comm& comm, uint64_t capacity_bytes, ReduceOp op = ReduceOp::Sum) {
    check(hccn_bucket_create(comm.get(), capacity_bytes, datatype_v<T>, hccn_reduce_op(op), &b_),
          "hccn_bucket_create");
  }
  ~Bucket() {
    if (b_) hccn_bucket_destroy(b_);  // local: pending tensors are dropped (flush first)
  }
  Bucket(const Bucket&) = delete;
  Bucket& operator=(const Bucket&) = delete;
  Bucket(Bucket&& o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
  Bucket& operator=(Bucket&& o) noexcept {
    if (this != &o) {
      if (b_) hccn_bucket_destroy(b_);
      b_ = std::exchange(o.b_, nullptr);
    }
    return *this;
  }

  // `buf` belongs to the library until the flush that covers it has completed.
  void add(T* buf, uint64_t count, StreamRef s = {}) {
    check(hccn_bucket_add(b_, buf, count, s.get()), "hccn_bucket_add");
  }
  void flush(StreamRef s = {}) { check(hccn_bucket_flush(b_, s.get()), "hccn_bucket_flush"); }

 private:
  hccn_bucket* b_ = nullptr;
};

}  // namespace hccn

#endif  // C++17
#undef HCCN_HPP_CPLUSPLUS
#endif  // HCCN_HPP
