// The C++ twin of examples/c/allreduce.c, through include/hccn.hpp: RAII handles, typed
// buffers, errors as exceptions. Launch with hccnrun:
//
//   hccnrun -n 2 ./allreduce_cpp
#include <hccn.hpp>

#include <cstdio>
#include <cstdint>
#include <vector>

int main() try {
  hccn::Comm comm = hccn::Comm::from_env();
  const uint32_t rank = comm.rank(), size = comm.size();
  const uint32_t tri = size * (size + 1) / 2;
  int wrong = 0;

  // 1. Blocking, in place: rank r holds (r + 1) * i; every rank gets i * size * (size + 1) / 2.
  std::vector<float> grad(1024);
  for (size_t i = 0; i < grad.size(); i++) grad[i] = float((rank + 1) * i);
  comm.allreduce(grad);  // hccn::datatype_v<float> == HCCN_FP32, ReduceOp::Sum
  for (size_t i = 0; i < grad.size(); i++) wrong += grad[i] != float(i * tri);

  // 2. On a stream, with an event: the call enqueues, the event tells when it is done.
  std::vector<int64_t> counts(256, int64_t(rank) + 1), total(256);
  {
    hccn::Stream stream;
    hccn::Event done;
    comm.allreduce(counts.data(), total.data(), counts.size(), hccn::ReduceOp::Sum, stream);
    done.record(stream);
    done.synchronize();
  }
  for (int64_t v : total) wrong += v != int64_t(tri);

  // 3. Allgather of each rank's id, and a broadcast from the last rank.
  std::vector<uint32_t> ids = comm.allgather(std::vector<uint32_t>{rank});
  for (uint32_t r = 0; r < size; r++) wrong += ids[r] != r;
  std::vector<double> model(8, rank == size - 1 ? 2.5 : 0.0);
  comm.broadcast(model, size - 1);
  for (double v : model) wrong += v != 2.5;

  // 4. A mistake is an exception carrying the code and the library's message; the
  //    communicator stays usable.
  try {
    comm.broadcast(model, size);  // no such root
    wrong++;
    std::printf("rank %u: a broadcast from root %u did not throw\n", rank, size);
  } catch (const hccn::Error& e) {
    if (e.code() != HCCN_ERROR_INVALID_ARGUMENT) wrong++;
    if (rank == 0) std::printf("rank 0: bad root caught: %s\n", e.what());
  }
  comm.barrier();

  std::printf("rank %u of %u: C++ allreduce %s (grad[1023] = %g, counts[0] = %lld)\n", rank, size,
              wrong ? "WRONG" : "ok", double(grad[1023]), static_cast<long long>(total[0]));
  return wrong ? 1 : 0;
} catch (const hccn::Error& e) {
  std::fprintf(stderr, "hccn error %d: %s\n", int(e.code()), e.what());
  return 1;
}
