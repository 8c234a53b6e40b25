// The whole CollectiveCommunicationLib interface of libhccn_ms.so, driven as MindSpore drives
// it (dlopen, communication_lib_instance, virtual calls through the wheel's own class), on N
// ranks under hccnrun. MindSpore's CPU kernels reach only part of it (AllReduce sum on
// float32/float16, AllGather, Broadcast); this covers the rest: every TypeId hccn maps, every
// reduce op, ReduceScatter, Gather, Scatter, Send/Recv, groups made as CollectiveManager makes
// them, and the errors. Every value is exact: each rank computes what every rank holds.
//
// Built by build.sh --interface-test (same headers and ABI as the library) into
// OUT/hccn_ms_interface_test.so, whose hccn_ms_interface_test(path) tests.py-style runner
// tests/interface.py calls: MindSpore's libraries need a Python process around them.
// Run: hccnrun -n N -- python interface.py OUT
// Prints "[ms-interface] rank R of N: K checks ok", or FAIL lines and returns 1.

#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "include/runtime/hardware_abstract/collective/collective_communication_lib.h"

using mindspore::TypeId;
using mindspore::device::CollectiveCommunicationLib;
using mindspore::device::CollectiveOpReduceType;

namespace {

constexpr char kWorld[] = "mccl_world_group";
uint32_t g_rank = 0;
uint32_t g_size = 0;
int g_checks = 0;
int g_failures = 0;

void Check(bool ok, const std::string &what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL rank %u: %s\n", g_rank, what.c_str());
    std::fflush(stdout);
  }
}

// Runs `f`, which must throw std::runtime_error whose text contains `needle`.
void CheckThrows(const std::function<void()> &f, const std::string &needle, const std::string &what) {
  try {
    f();
    Check(false, what + ": no exception");
  } catch (const std::runtime_error &e) {
    Check(std::string(e.what()).find(needle) != std::string::npos, what + ": message \"" + e.what() + "\"");
  }
}

// --- values of every type, as doubles ------------------------------------------------------------

uint16_t ToHalf(double v) {  // exact for the small integers and halves used here
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  double a = std::fabs(v);
  int e = 0;
  double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  uint16_t exp = uint16_t(e - 1 + 15);
  uint16_t frac = uint16_t(std::lround((m * 2 - 1) * 1024));
  return uint16_t(sign | (exp << 10) | frac);
}

double FromHalf(uint16_t h) {
  int exp = (h >> 10) & 0x1f;
  int frac = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(frac, -24) : std::ldexp(1024 + frac, exp - 25);
  return (h & 0x8000) ? -v : v;
}

struct Type {
  TypeId id;
  const char *name;
  size_t size;
  bool is_float;
};

const std::vector<Type> kTypes = {
  {TypeId::kNumberTypeInt8, "int8", 1, false},        {TypeId::kNumberTypeInt16, "int16", 2, false},
  {TypeId::kNumberTypeInt32, "int32", 4, false},      {TypeId::kNumberTypeInt, "int", 4, false},
  {TypeId::kNumberTypeInt64, "int64", 8, false},      {TypeId::kNumberTypeUInt8, "uint8", 1, false},
  {TypeId::kNumberTypeUInt16, "uint16", 2, false},    {TypeId::kNumberTypeUInt32, "uint32", 4, false},
  {TypeId::kNumberTypeUInt, "uint", 4, false},        {TypeId::kNumberTypeUInt64, "uint64", 8, false},
  {TypeId::kNumberTypeFloat16, "float16", 2, true},   {TypeId::kNumberTypeBFloat16, "bfloat16", 2, true},
  {TypeId::kNumberTypeFloat32, "float32", 4, true},   {TypeId::kNumberTypeFloat, "float", 4, true},
  {TypeId::kNumberTypeFloat64, "float64", 8, true},   {TypeId::kNumberTypeDouble, "double", 8, true},
};

const Type &Float32() { return kTypes[12]; }

std::vector<uint8_t> Encode(const Type &t, const std::vector<double> &values) {
  std::vector<uint8_t> out(values.size() * t.size);
  for (size_t i = 0; i < values.size(); i++) {
    double v = values[i];
    uint8_t *p = out.data() + i * t.size;
    switch (t.id) {
      case TypeId::kNumberTypeFloat16: {
        uint16_t h = ToHalf(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case TypeId::kNumberTypeBFloat16: {
        float f = float(v);
        uint32_t bits = 0;
        std::memcpy(&bits, &f, 4);
        uint16_t b = uint16_t(bits >> 16);
        std::memcpy(p, &b, 2);
        break;
      }
      case TypeId::kNumberTypeFloat32:
      case TypeId::kNumberTypeFloat: {
        float f = float(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case TypeId::kNumberTypeFloat64:
      case TypeId::kNumberTypeDouble:
        std::memcpy(p, &v, 8);
        break;
      default: {  // integers, little-endian two's complement
        int64_t x = int64_t(v);
        std::memcpy(p, &x, t.size);
      }
    }
  }
  return out;
}

std::vector<double> Decode(const Type &t, const std::vector<uint8_t> &bytes) {
  std::vector<double> out(bytes.size() / t.size);
  for (size_t i = 0; i < out.size(); i++) {
    const uint8_t *p = bytes.data() + i * t.size;
    switch (t.id) {
      case TypeId::kNumberTypeFloat16: {
        uint16_t h = 0;
        std::memcpy(&h, p, 2);
        out[i] = FromHalf(h);
        break;
      }
      case TypeId::kNumberTypeBFloat16: {
        uint16_t b = 0;
        std::memcpy(&b, p, 2);
        uint32_t bits = uint32_t(b) << 16;
        float f = 0;
        std::memcpy(&f, &bits, 4);
        out[i] = f;
        break;
      }
      case TypeId::kNumberTypeFloat32:
      case TypeId::kNumberTypeFloat: {
        float f = 0;
        std::memcpy(&f, p, 4);
        out[i] = f;
        break;
      }
      case TypeId::kNumberTypeFloat64:
      case TypeId::kNumberTypeDouble:
        std::memcpy(&out[i], p, 8);
        break;
      default: {
        int64_t x = 0;
        std::memcpy(&x, p, t.size);
        if (t.size < 8 && std::string(t.name).rfind("int", 0) == 0) {  // sign-extend signed types
          int shift = int(64 - 8 * t.size);
          x = int64_t(uint64_t(x) << shift) >> shift;
        }
        out[i] = double(x);
      }
    }
  }
  return out;
}

std::string Show(const std::vector<double> &v) {
  std::string s = "[";
  for (double x : v) s += std::to_string(x) + " ";
  return s + "]";
}

void CheckValues(const Type &t, const std::vector<uint8_t> &got, const std::vector<double> &want,
                 const std::string &what) {
  std::vector<double> g = Decode(t, got);
  Check(g == want, what + " " + t.name + ": got " + Show(g) + " want " + Show(want));
}

template <class F>
std::vector<double> Table(size_t count, F f) {
  std::vector<double> v(count);
  for (size_t i = 0; i < count; i++) v[i] = f(i);
  return v;
}

// --- the checks ----------------------------------------------------------------------------------

void CheckReductions(CollectiveCommunicationLib *lib, const Type &t) {
  const double n = g_size, r = g_rank, tri = n * (n + 1) / 2;
  const size_t count = 5;
  struct Case {
    CollectiveOpReduceType op;
    const char *name;
    std::function<double(size_t)> mine;
    std::function<double(size_t)> want;
  };
  std::vector<Case> cases = {
    {CollectiveOpReduceType::Reduce_Sum, "sum", [&](size_t i) { return i + r + 1; },
     [&](size_t i) { return n * i + tri; }},
    {CollectiveOpReduceType::Reduce_Max, "max", [&](size_t i) { return i + r; }, [&](size_t i) { return i + n - 1; }},
    {CollectiveOpReduceType::Reduce_Min, "min", [&](size_t i) { return i + r; }, [&](size_t i) { return double(i); }},
    {CollectiveOpReduceType::Reduce_Prod, "prod", [&](size_t i) { return 1.0 + double((i + g_rank) % 2); },
     [&](size_t i) {
       double p = 1;
       for (uint32_t k = 0; k < g_size; k++) p *= 1.0 + double((i + k) % 2);
       return p;
     }},
    // Mean is hccn's AVG: exact halves on floats, truncated toward zero on integers.
    {CollectiveOpReduceType::Reduce_Mean, "mean", [&](size_t i) { return i + r; },
     [&](size_t i) {
       double mean = (n * i + n * (n - 1) / 2) / n;
       return t.is_float ? mean : std::trunc(mean);
     }},
  };
  for (const Case &c : cases) {
    std::vector<uint8_t> send = Encode(t, Table(count, c.mine));
    std::vector<uint8_t> recv(send.size(), 0xee);
    lib->AllReduce(send.data(), recv.data(), count, t.id, c.op, kWorld);
    CheckValues(t, recv, Table(count, c.want), std::string("AllReduce ") + c.name);
    lib->AllReduce(send.data(), send.data(), count, t.id, c.op, kWorld);  // in place
    CheckValues(t, send, Table(count, c.want), std::string("AllReduce in place ") + c.name);
  }

  // ReduceScatter: rank q sends n blocks of 2, block k holding k + j + q; rank r gets block r summed.
  std::vector<uint8_t> send = Encode(t, Table(2 * g_size, [&](size_t i) { return double(i / 2 + i % 2 + g_rank); }));
  std::vector<uint8_t> recv(2 * t.size, 0xee);
  lib->ReduceScatter(send.data(), recv.data(), 2, t.id, CollectiveOpReduceType::Reduce_Sum, kWorld);
  CheckValues(t, recv, Table(2, [&](size_t j) { return n * (r + j) + n * (n - 1) / 2; }), "ReduceScatter sum");
}

void CheckDataMovement(CollectiveCommunicationLib *lib, const Type &t) {
  const double r = g_rank;
  // AllGather: rank k's block is 10k + i.
  std::vector<uint8_t> mine = Encode(t, Table(3, [&](size_t i) { return 10 * r + i; }));
  std::vector<uint8_t> all(3 * g_size * t.size, 0xee);
  lib->AllGather(mine.data(), all.data(), 3, t.id, kWorld);
  CheckValues(t, all, Table(3 * g_size, [](size_t i) { return 10.0 * double(i / 3) + double(i % 3); }), "AllGather");

  for (uint32_t root = 0; root < g_size; root++) {
    std::vector<uint8_t> send = Encode(t, Table(4, [&](size_t i) { return 5 * r + i; }));
    std::vector<uint8_t> recv(send.size(), 0xee);
    lib->Broadcast(send.data(), recv.data(), 4, t.id, root, kWorld);
    CheckValues(t, recv, Table(4, [&](size_t i) { return 5.0 * root + i; }), "Broadcast from " + std::to_string(root));
    lib->Broadcast(send.data(), send.data(), 4, t.id, root, kWorld);
    CheckValues(t, send, Table(4, [&](size_t i) { return 5.0 * root + i; }),
                "Broadcast in place from " + std::to_string(root));
  }

  const uint32_t root = g_size - 1;
  std::vector<uint8_t> gathered(2 * g_size * t.size, 0xee);
  std::vector<uint8_t> two = Encode(t, {r, r + 1});
  lib->Gather(two.data(), gathered.data(), 2, t.id, root, kWorld);
  if (g_rank == root) {
    CheckValues(t, gathered, Table(2 * g_size, [](size_t i) { return double(i / 2 + i % 2); }), "Gather");
  }
  std::vector<uint8_t> source = Encode(t, Table(2 * g_size, [&](size_t i) {
    return g_rank == root ? 3.0 * double(i / 2) + double(i % 2) : 0.0;
  }));
  std::vector<uint8_t> piece(2 * t.size, 0xee);
  lib->Scatter(source.data(), piece.data(), 2, t.id, root, kWorld);
  CheckValues(t, piece, {3 * r, 3 * r + 1}, "Scatter");

  // Send/Recv around the ring.
  const uint32_t next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  std::vector<uint8_t> out = Encode(t, Table(3, [&](size_t i) { return 7 * r + i; }));
  std::vector<uint8_t> in(out.size(), 0xee);
  lib->Send(out.data(), 3, t.id, next, kWorld);
  lib->Recv(in.data(), 3, t.id, prev, kWorld);
  CheckValues(t, in, Table(3, [&](size_t i) { return 7.0 * prev + i; }), "Send/Recv");
}

// A group made the way CollectiveManager makes one: created twice (host and "device" side, the
// same library on CPU), root info generated and "broadcast", then initialized.
bool MakeGroup(CollectiveCommunicationLib *lib, const std::string &name, const std::vector<uint32_t> &ranks) {
  lib->CreateCommunicationGroup(name, ranks, 0, uint32_t(ranks.size()));
  lib->CreateCommunicationGroup(name, ranks, 0, uint32_t(ranks.size()));
  auto group = lib->GetGroup(name);
  size_t size = 0;
  void *root_info = group->GenerateRootInfo(&size);
  Check(root_info != nullptr && size > 0, "GenerateRootInfo of " + name);
  lib->BroadcastUniqueID(name, size, root_info);
  return group->Initialize(root_info);
}

void CheckGroups(CollectiveCommunicationLib *lib) {
  const Type &f32 = Float32();
  std::vector<uint32_t> parity;
  for (uint32_t k = g_rank % 2; k < g_size; k += 2) parity.push_back(k);
  const std::string name = "parity" + std::to_string(g_rank % 2);
  Check(MakeGroup(lib, name, parity), "creating " + name);
  uint32_t me = 0;
  while (parity[me] != g_rank) me++;
  Check(lib->GetRankId(name) == me, "GetRankId(" + name + ")");
  Check(lib->GetGroupSize(name) == parity.size(), "GetGroupSize(" + name + ")");
  Check(lib->GetWorldRankFromGroupRank(name, 0) == parity[0], "GetWorldRankFromGroupRank");
  Check(lib->GetGroupRankFromWorldRank(g_rank, name) == me, "GetGroupRankFromWorldRank");
  double members = 0;
  for (uint32_t k : parity) members += k + 1;
  std::vector<uint8_t> x = Encode(f32, {g_rank + 1.0, 1.0});
  lib->AllReduce(x.data(), x.data(), 2, f32.id, CollectiveOpReduceType::Reduce_Sum, name);
  CheckValues(f32, x, {members, double(parity.size())}, "AllReduce in " + name);
  std::vector<uint8_t> b = Encode(f32, {double(g_rank)});
  lib->Broadcast(b.data(), b.data(), 1, f32.id, 0, name);  // the root is a group rank
  CheckValues(f32, b, {double(parity[0])}, "Broadcast from group rank 0 of " + name);

  Check(lib->DestroyCommunicationGroup(name), "DestroyCommunicationGroup(" + name + ")");
  CheckThrows([&] { lib->AllReduce(x.data(), x.data(), 2, f32.id, CollectiveOpReduceType::Reduce_Sum, name); },
              "no communication group " + name, "AllReduce on a destroyed group");

  // A group without this rank: its creation is refused (hccn_new_group is for members only).
  const std::string other = "without" + std::to_string(g_rank);
  std::vector<uint32_t> others;
  for (uint32_t k = 0; k < g_size; k++) {
    if (k != g_rank) others.push_back(k);
  }
  lib->CreateCommunicationGroup(other, others, 0, uint32_t(others.size()));
  Check(!lib->GetGroup(other)->Initialize(nullptr), "initializing a group without this rank fails");
  lib->DestroyCommunicationGroup(other);
}

void CheckErrors(CollectiveCommunicationLib *lib) {
  const Type &f32 = Float32();
  std::vector<uint8_t> x = Encode(f32, {1.0});
  CheckThrows([&] { lib->AllReduce(x.data(), x.data(), 1, f32.id, CollectiveOpReduceType::Reduce_Sum, "nowhere"); },
              "no communication group nowhere", "unknown group");
  CheckThrows([&] { lib->AllReduce(x.data(), x.data(), 1, f32.id, CollectiveOpReduceType::Reduce_ASum, kWorld); },
              "no reduce op", "ASum");
  const auto sum = CollectiveOpReduceType::Reduce_Sum;
  CheckThrows([&] { lib->AllReduce(x.data(), x.data(), 1, TypeId::kNumberTypeComplex64, sum, kWorld); }, "no datatype",
              "complex64");
  uint8_t flags[2] = {1, 0};
  CheckThrows([&] { lib->AllReduce(flags, flags, 2, TypeId::kNumberTypeBool, sum, kWorld); }, "no reduction for bool",
              "bool allreduce");
  std::vector<uint8_t> all(2 * g_size, 0xee);
  uint8_t mine[2] = {uint8_t(g_rank % 2), 1};
  lib->AllGather(mine, all.data(), 2, TypeId::kNumberTypeBool, kWorld);  // bool moves as bytes
  bool ok = true;
  for (uint32_t k = 0; k < g_size; k++) ok = ok && all[2 * k] == k % 2 && all[2 * k + 1] == 1;
  Check(ok, "AllGather bool");
  CheckThrows([&] { lib->Broadcast(x.data(), x.data(), 1, f32.id, g_size, kWorld); }, "root",
              "Broadcast from a root outside the world");
  // Still usable after every refusal above.
  lib->AllReduce(x.data(), x.data(), 1, f32.id, CollectiveOpReduceType::Reduce_Sum, kWorld);
  CheckValues(f32, x, {double(g_size)}, "AllReduce after errors");
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int hccn_ms_interface_test(const char *lib_path) {
  void *handle = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  auto instance = reinterpret_cast<CollectiveCommunicationLib *(*)()>(dlsym(handle, "communication_lib_instance"));
  if (instance == nullptr) {
    std::fprintf(stderr, "no communication_lib_instance in %s\n", lib_path);
    return 2;
  }
  try {
    // As CollectiveManager::Initialize does on CPU: host side, then the same library as the
    // "device" side, then the world group.
    CollectiveCommunicationLib *lib = instance();
    Check(lib->Initialize(), "Initialize");
    g_rank = lib->global_rank_id();
    g_size = lib->global_rank_size();
    Check(lib->global_group_name() == kWorld, "world group name");
    std::vector<uint32_t> world;
    for (uint32_t k = 0; k < g_size; k++) world.push_back(k);
    std::vector<size_t> hashes(g_size, 0);
    lib->AllGatherHostHashName(1000 + g_rank, &hashes);
    bool hashes_ok = true;
    for (uint32_t k = 0; k < g_size; k++) hashes_ok = hashes_ok && hashes[k] == 1000 + k;
    Check(hashes_ok, "AllGatherHostHashName");
    Check(lib->Initialize(), "Initialize again");
    Check(MakeGroup(lib, kWorld, world), "world group");
    Check(lib->GetRankId(kWorld) == g_rank && lib->GetGroupSize(kWorld) == g_size, "world rank and size");

    for (const Type &t : kTypes) {
      CheckReductions(lib, t);
      CheckDataMovement(lib, t);
    }
    CheckGroups(lib);
    CheckErrors(lib);
    Check(lib->Finalize(), "Finalize");
    CheckThrows(
      [&] {
        lib->AllReduce(hashes.data(), hashes.data(), 1, TypeId::kNumberTypeUInt64, CollectiveOpReduceType::Reduce_Sum,
                       kWorld);
      },
      "no communication group", "AllReduce after Finalize");
  } catch (const std::exception &e) {
    std::printf("FAIL rank %u: unexpected exception: %s\n", g_rank, e.what());
    std::fflush(stdout);
    return 1;
  }
  if (g_failures > 0) {
    std::printf("[ms-interface] rank %u of %u: %d of %d checks FAILED\n", g_rank, g_size, g_failures, g_checks);
    std::fflush(stdout);
    return 1;
  }
  std::printf("[ms-interface] rank %u of %u: %d checks ok\n", g_rank, g_size, g_checks);
  std::fflush(stdout);
  return 0;
}
