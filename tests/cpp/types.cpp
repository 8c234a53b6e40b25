// Compile-time checks of include/hccn.hpp's type mapping and API shape; built (not run) by
// tests/tests/cpp_packaging.rs with -Wall -Wextra -Wpedantic -Werror.
#include <hccn.hpp>

#include <array>
#include <type_traits>
#include <vector>

static_assert(hccn::datatype_v<int8_t> == HCCN_INT8);
static_assert(hccn::datatype_v<int16_t> == HCCN_INT16);
static_assert(hccn::datatype_v<int32_t> == HCCN_INT32);
static_assert(hccn::datatype_v<int64_t> == HCCN_INT64);
static_assert(hccn::datatype_v<uint8_t> == HCCN_UINT8);
static_assert(hccn::datatype_v<uint16_t> == HCCN_UINT16);
static_assert(hccn::datatype_v<uint32_t> == HCCN_UINT32);
static_assert(hccn::datatype_v<uint64_t> == HCCN_UINT64);
static_assert(hccn::datatype_v<long long> == HCCN_INT64);
static_assert(hccn::datatype_v<unsigned long long> == HCCN_UINT64);
static_assert(hccn::datatype_v<long> == HCCN_INT64);
static_assert(hccn::datatype_v<float> == HCCN_FP32);
static_assert(hccn::datatype_v<const double> == HCCN_FP64);
static_assert(hccn::datatype_v<hccn::fp16> == HCCN_FP16);
static_assert(hccn::datatype_v<hccn::bf16> == HCCN_BF16);
static_assert(sizeof(hccn::fp16) == 2 && sizeof(hccn::bf16) == 2);
static_assert(int(hccn::ReduceOp::Avg) == HCCN_AVG);

// RAII handles are move-only.
static_assert(!std::is_copy_constructible_v<hccn::Comm> && std::is_nothrow_move_constructible_v<hccn::Comm>);
static_assert(!std::is_copy_constructible_v<hccn::Stream> && std::is_nothrow_move_constructible_v<hccn::Stream>);
static_assert(!std::is_copy_constructible_v<hccn::Event> && std::is_nothrow_move_constructible_v<hccn::Event>);
static_assert(!std::is_copy_constructible_v<hccn::Bucket<float>>);
static_assert(std::is_base_of_v<std::runtime_error, hccn::Error>);

// Every overload instantiates (never called).
[[maybe_unused]] static void shapes(hccn::Comm& c, hccn::Stream& s) {
  std::vector<float> v(4);
  std::array<int32_t, 4> a{};
  c.allreduce(v);
  c.allreduce(a, hccn::ReduceOp::Max, s);
  c.allreduce(v.data(), v.data(), v.size(), hccn::ReduceOp::Avg, s);
  c.broadcast(a, 0);
  c.reduce(v.data(), v.data(), 4, hccn::ReduceOp::Sum, 0);
  std::vector<double> g = c.allgather(std::vector<double>(2));
  std::vector<int64_t> r = c.reduce_scatter(std::vector<int64_t>(4));
  c.alltoall(v.data(), v.data(), 1, s);
  c.send(a.data(), 4, 1);
  c.recv(a.data(), 4, 1, s);
  c.gather(v.data(), v.data(), 1, 0);
  c.scatter(v.data(), v.data(), 1, 0);
  c.barrier(s);
  hccn::Bucket<float> b(c, 1 << 20, hccn::ReduceOp::Sum);
  b.add(v.data(), v.size(), s);
  b.flush(s);
  std::optional<hccn::Comm> sub = c.split(0, 0);
  hccn::Comm group = c.new_group({0, 1});
  hccn::Comm survivors = c.shrink();
  hccn::Comm grown = c.rebuild(1000);
  std::vector<uint32_t> failed = c.failed_ranks();
  uint64_t epoch = c.epoch();
  hccn_result health = c.async_error();
  hccn::Event e;
  e.record(s);
  e.record();
  bool done = e.query() && s.query();
  e.synchronize();
  s.synchronize();
  c.revoke();
  c.abort();
  hccn::Comm adopted(group.release());
  (void)epoch;
  (void)health;
  (void)done;
  (void)g;
  (void)r;
}

int main() { return 0; }
