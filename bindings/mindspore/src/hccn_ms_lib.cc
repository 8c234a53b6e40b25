// MindSpore's CollectiveCommunicationLib over hccn's C ABI.
//
// How MindSpore 2.10 drives it on CPU (CollectiveManager::Initialize, "MPI" route; the calls
// were logged): Initialize, CreateCommunicationGroup(world, local size 0), AllGatherHostHashName
// (to number the ranks per host), SetLocalGroupRank/Size; then, the "device" library being this
// same instance on CPU, Initialize again, CreateCommunicationGroup(world) twice more (host and
// device side) and GetGroup(world)->Initialize(). create_group(name) gives
// CreateCommunicationGroup twice, GenerateRootInfo, BroadcastUniqueID and Initialize. Repeated
// calls are therefore no-ops here.

#include "hccn_ms_lib.h"

#include <cstring>
#include <map>

namespace hccn_ms {

HccnCollectiveLib &HccnCollectiveLib::Instance() {
  // Never destroyed: MindSpore's CollectiveManager may still call in while static objects are
  // torn down at exit, after a function-local static would already be gone.
  static HccnCollectiveLib *instance = new HccnCollectiveLib();
  return *instance;
}

void HccnCollectiveLib::Join() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!world_) world_.emplace(hccn::Comm::from_env());
}

uint32_t HccnCollectiveLib::WorldRank() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!world_) throw Refused("not part of an hccn job (launch with hccnrun)");
  return world_->rank();
}

uint32_t HccnCollectiveLib::WorldSize() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!world_) throw Refused("not part of an hccn job (launch with hccnrun)");
  return world_->size();
}

bool HccnCollectiveLib::Initialize(uint32_t, uint32_t, uint32_t) {
  // MindSpore's arguments are placeholders on the host side: the world is hccnrun's.
  try {
    Join();
    std::lock_guard<std::mutex> lock(mu_);
    global_rank_id_ = world_->rank();
    global_rank_size_ = world_->size();
    global_group_name_ = kWorldGroup;
    initialized_ = true;
    finalized_ = false;
    return true;
  } catch (const std::exception &e) {
    Raise(std::string("joining the hccnrun job: ") + e.what() +
          " (launch with hccnrun, and import hccn_ms before mindspore.communication.init())");
  }
}

bool HccnCollectiveLib::Finalize() {
  // Lock order: a group's own lock, then the world's (world_ops_), then mu_; never the reverse.
  std::map<std::string, std::shared_ptr<CommunicationGroup>> groups;
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups.swap(groups_);
  }
  for (auto &entry : groups) (void)entry.second->Finalize();  // waits for a collective in flight
  std::lock_guard<std::mutex> ops(world_ops_);
  std::lock_guard<std::mutex> lock(mu_);
  world_.reset();
  initialized_ = false;
  finalized_ = true;
  return true;
}

bool HccnCollectiveLib::CreateCommunicationGroup(const std::string &group_name,
                                                 const std::vector<uint32_t> &group_ranks, uint32_t local_group_rank,
                                                 uint32_t local_group_size, const GroupOptions &) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!world_) Raise("creating group " + group_name + " before the library is initialised");
  if (groups_.count(group_name) != 0) return true;  // the second, "device side" call
  for (uint32_t r : group_ranks) {
    if (r >= global_rank_size_) {
      Raise("group " + group_name + ": rank " + std::to_string(r) + " is not in a world of " +
            std::to_string(global_rank_size_));
    }
  }
  groups_[group_name] = std::make_shared<HccnGroup>(group_name, group_ranks, global_rank_id_, local_group_rank,
                                                    local_group_size, world_->get(), &world_ops_);
  return true;
}

bool HccnCollectiveLib::DestroyCommunicationGroup(const std::string &group_name) {
  std::shared_ptr<CommunicationGroup> group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = groups_.find(group_name);
    if (it == groups_.end()) Raise("destroying group " + group_name + ", which does not exist");
    group = it->second;
    groups_.erase(it);
  }
  return group->Finalize();  // outside mu_: see Finalize
}

std::string HccnCollectiveLib::CommName(const std::string &group_name) { return "hccn:" + group_name; }

bool HccnCollectiveLib::AllGatherHostHashName(size_t host_hash_name, std::vector<size_t> *host_hash_names) {
  static_assert(sizeof(size_t) == sizeof(uint64_t), "host hashes travel as uint64");
  bool ok = RunOnWorld("gathering host names", [&](hccn_comm *world) {
    if (host_hash_names == nullptr || host_hash_names->size() != global_rank_size_) {
      throw Refused("the host hash vector must hold one entry per rank");
    }
    uint64_t mine = host_hash_name;
    hccn::check(hccn_allgather(&mine, host_hash_names->data(), 1, HCCN_UINT64, world, nullptr), "hccn_allgather");
  });
  if (!ok) throw std::runtime_error("hccn_ms: " + LastError());
  return true;
}

bool HccnCollectiveLib::BroadcastUniqueID(const std::string &, size_t, void *) {
  // Nothing to share: hccn_new_group meets the group's members through the world communicator.
  return true;
}

std::shared_ptr<HccnGroup> HccnCollectiveLib::Find(const std::string &name, const char *what) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = groups_.find(name);
  if (it == groups_.end()) {
    Raise(std::string(what) + ": no communication group " + name + " on rank " + std::to_string(global_rank_id_) +
          " (create_group makes one, on its members)");
  }
  // Every group in the map is one CreateCommunicationGroup made.
  return std::static_pointer_cast<HccnGroup>(it->second);
}

bool HccnCollectiveLib::AllGather(const void *send_buff, void *recv_buff, size_t send_count, TypeId data_type,
                                  const std::string &group_name, void *) {
  return Find(group_name, "AllGather")->Run("AllGather", [&](hccn_comm *c) {
    hccn::check(hccn_allgather(send_buff, recv_buff, send_count, ToHccn(data_type, false), c, nullptr),
                "hccn_allgather");
  });
}

bool HccnCollectiveLib::AllReduce(const void *send_buff, void *recv_buff, size_t send_count, TypeId data_type,
                                  CollectiveOpReduceType reduce_op, const std::string &group_name, void *) {
  return Find(group_name, "AllReduce")->Run("AllReduce", [&](hccn_comm *c) {
    hccn::check(hccn_allreduce(send_buff, recv_buff, send_count, ToHccn(data_type, true), ToHccn(reduce_op), c,
                               nullptr),
                "hccn_allreduce");
  });
}

bool HccnCollectiveLib::Broadcast(const void *send_buff, void *recv_buff, size_t send_count, TypeId data_type,
                                  uint32_t root_rank, const std::string &group_name, void *) {
  return Find(group_name, "Broadcast")->Run("Broadcast", [&](hccn_comm *c) {
    hccn_datatype dt = ToHccn(data_type, false);
    // hccn broadcasts in place: the root's data goes out of (and every rank's lands in) recv_buff.
    if (send_buff != recv_buff && send_count > 0) std::memcpy(recv_buff, send_buff, send_count * ElementSize(dt));
    hccn::check(hccn_broadcast(recv_buff, send_count, dt, root_rank, c, nullptr), "hccn_broadcast");
  });
}

bool HccnCollectiveLib::ReduceScatter(const void *send_buff, void *recv_buff, size_t recv_count, TypeId data_type,
                                      CollectiveOpReduceType reduce_op, const std::string &group_name, void *) {
  return Find(group_name, "ReduceScatter")->Run("ReduceScatter", [&](hccn_comm *c) {
    hccn::check(hccn_reduce_scatter(send_buff, recv_buff, recv_count, ToHccn(data_type, true), ToHccn(reduce_op), c,
                                    nullptr),
                "hccn_reduce_scatter");
  });
}

bool HccnCollectiveLib::Gather(const void *send_buff, void *recv_buff, size_t send_count, TypeId data_type,
                               uint32_t root_rank, const std::string &group_name, void *) {
  return Find(group_name, "Gather")->Run("Gather", [&](hccn_comm *c) {
    hccn::check(hccn_gather(send_buff, recv_buff, send_count, ToHccn(data_type, false), root_rank, c, nullptr),
                "hccn_gather");
  });
}

bool HccnCollectiveLib::Scatter(const void *send_buff, void *recv_buff, size_t recv_count, TypeId data_type,
                                uint32_t root_rank, const std::string &group_name, void *) {
  return Find(group_name, "Scatter")->Run("Scatter", [&](hccn_comm *c) {
    hccn::check(hccn_scatter(send_buff, recv_buff, recv_count, ToHccn(data_type, false), root_rank, c, nullptr),
                "hccn_scatter");
  });
}

bool HccnCollectiveLib::Send(const void *send_buff, size_t count, TypeId data_type, uint32_t peer,
                             const std::string &group_name, void *) {
  return Find(group_name, "Send")->Run("Send", [&](hccn_comm *c) {
    hccn::check(hccn_send(send_buff, count, ToHccn(data_type, false), peer, c, nullptr), "hccn_send");
  });
}

bool HccnCollectiveLib::Recv(void *recv_buff, size_t count, TypeId data_type, uint32_t peer,
                             const std::string &group_name, void *) {
  return Find(group_name, "Recv")->Run("Recv", [&](hccn_comm *c) {
    hccn::check(hccn_recv(recv_buff, count, ToHccn(data_type, false), peer, c, nullptr), "hccn_recv");
  });
}

}  // namespace hccn_ms
