// hccn as MindSpore's collective communication library on CPU.
//
// MindSpore's CPU backend, when it believes it runs under Open MPI (OMPI_COMMAND and PMIX_RANK
// set, MS_ROLE unset), dlopens "libmpi_collective.so" by bare name and calls its
// `communication_lib_instance()` for a `mindspore::device::CollectiveCommunicationLib`. This
// library carries that soname and that entry point: once the hccn_ms package has loaded it,
// MindSpore's own dlopen returns it, and `mindspore.communication.init()`, `ops.AllReduce` & co.
// and the data-parallel gradient reducer run over hccn.
//
// The classes derive from the headers shipped in the MindSpore wheel, so their layout is that
// wheel's; build.sh compiles against the installed MindSpore and the version guard
// (hccn_ms_version.cc) refuses any other.

#ifndef HCCN_MS_LIB_H_
#define HCCN_MS_LIB_H_

#include <hccn.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "include/runtime/hardware_abstract/collective/collective_communication_lib.h"
#include "include/runtime/hardware_abstract/collective/communication_group.h"
#include "hccn_ms_types.h"

// The library is built with -fvisibility=hidden; these are its entry points.
#define HCCN_MS_EXPORT __attribute__((visibility("default")))

namespace hccn_ms {

using mindspore::TypeId;
using mindspore::device::CollectiveOpReduceType;
using mindspore::device::CommunicationGroup;
using mindspore::device::GroupOptions;

// MindSpore's name for the world group on CPU (mindspore.communication.MCCL_WORLD_COMM_GROUP):
// what `init()` sets as GlobalComm.WORLD_COMM_GROUP and every op uses by default.
inline constexpr char kWorldGroup[] = "mccl_world_group";

// One MindSpore communication group: an hccn communicator (the world itself, or one made with
// hccn_new_group over the world's ranks) plus a lock, because MindSpore may launch kernels from
// several threads and one hccn communicator serves one thread at a time.
class HccnGroup final : public CommunicationGroup {
 public:
  HccnGroup(const std::string &name, const std::vector<uint32_t> &group_ranks, uint32_t global_rank,
            uint32_t local_group_rank, uint32_t local_group_size, hccn_comm *world, std::mutex *world_ops);
  ~HccnGroup() override;

  // Makes the hccn communicator. `root_info` is not used: hccn_new_group meets its members
  // through the world communicator.
  bool Initialize(void *root_info) override;
  bool Finalize() override;
  // MindSpore wants a non-null blob to pass around before Initialize; hccn needs none.
  void *GenerateRootInfo(size_t *root_info_size) override;

  // Runs `call(comm)` under the group's lock; Raise()s when the group has no communicator or
  // the call throws.
  template <class F>
  bool Run(const char *what, F call);

 private:
  hccn_comm *world_;                 // not owned
  std::mutex *world_ops_;            // the library's lock of the world communicator
  std::optional<hccn::Comm> owned_;  // set for groups other than the world
  hccn_comm *comm_ = nullptr;
  std::mutex own_ops_;
  std::mutex *ops_;  // world_ops_ for the world group, else &own_ops_
  uint64_t root_info_ = 0;
};

class HccnCollectiveLib final : public mindspore::device::CollectiveCommunicationLib {
 public:
  static HccnCollectiveLib &Instance();

  // Joins the job hccnrun started (hccn_init_from_env); idempotent. Throws hccn::Error.
  void Join();
  // Rank and size in the world; throw hccn::Error when not joined.
  uint32_t WorldRank();
  uint32_t WorldSize();

  // Runs `call(world)` under the world's lock (shared with the world group); false after
  // logging when not joined or when the call throws.
  template <class F>
  bool RunOnWorld(const char *what, F call);

  bool Initialize(uint32_t global_rank, uint32_t global_rank_size, uint32_t local_rank_id) override;
  bool Finalize() override;
  bool CreateCommunicationGroup(const std::string &group_name, const std::vector<uint32_t> &group_ranks,
                                uint32_t local_group_rank, uint32_t local_group_size,
                                const GroupOptions &config) override;
  bool DestroyCommunicationGroup(const std::string &group_name) override;
  std::string CommName(const std::string &group_name) override;
  bool AllGatherHostHashName(size_t host_hash_name, std::vector<size_t> *host_hash_names) override;
  bool BroadcastUniqueID(const std::string &group_name, size_t root_info_size, void *root_info) override;

  bool AllGather(const void *send_buff, void *recv_buff, size_t send_count, TypeId data_type,
                 const std::string &group_name, void *stream) override;
  bool AllReduce(const void *send_buff, void *recv_buff, size_t send_count, TypeId data_type,
                 CollectiveOpReduceType reduce_op, const std::string &group_name, void *stream) override;
  bool Broadcast(const void *send_buff, void *recv_buff, size_t send_count, TypeId data_type, uint32_t root_rank,
                 const std::string &group_name, void *stream) override;
  bool ReduceScatter(const void *send_buff, void *recv_buff, size_t recv_count, TypeId data_type,
                     CollectiveOpReduceType reduce_op, const std::string &group_name, void *stream) override;
  bool Gather(const void *send_buff, void *recv_buff, size_t send_count, TypeId data_type, uint32_t root_rank,
              const std::string &group_name, void *stream) override;
  bool Scatter(const void *send_buff, void *recv_buff, size_t recv_count, TypeId data_type, uint32_t root_rank,
               const std::string &group_name, void *stream) override;
  bool Send(const void *send_buff, size_t count, TypeId data_type, uint32_t peer, const std::string &group_name,
            void *stream) override;
  bool Recv(void *recv_buff, size_t count, TypeId data_type, uint32_t peer, const std::string &group_name,
            void *stream) override;

 private:
  HccnCollectiveLib() = default;
  ~HccnCollectiveLib() override = default;

  // The group named `name` (kept alive while in use, even if destroyed meanwhile); Raise()s
  // when there is none.
  std::shared_ptr<HccnGroup> Find(const std::string &name, const char *what);

  // One thread at a time on the world communicator: MindSpore's kernels (world group), the AOT
  // kernels, group creation. Taken before mu_ when both are held.
  std::mutex world_ops_;
  std::mutex mu_;  // guards world_ and groups_ (the base class's map)
  std::optional<hccn::Comm> world_;
};

template <class F>
bool HccnGroup::Run(const char *what, F call) {
  try {
    std::lock_guard<std::mutex> lock(*ops_);
    if (comm_ == nullptr) throw Refused("group " + name_ + " is not initialised on this rank");
    call(comm_);
    return true;
  } catch (const std::exception &e) {
    Raise(std::string(what) + " on group " + name_ + ": " + e.what());
  }
}

template <class F>
bool HccnCollectiveLib::RunOnWorld(const char *what, F call) {
  try {
    std::lock_guard<std::mutex> ops(world_ops_);  // Finalize cannot free the world meanwhile
    hccn_comm *world = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!world_) throw Refused("not part of an hccn job (launch with hccnrun)");
      world = world_->get();
    }
    call(world);
    return true;
  } catch (const std::exception &e) {
    return Report(std::string(what) + ": " + e.what());
  }
}

}  // namespace hccn_ms

#endif  // HCCN_MS_LIB_H_
