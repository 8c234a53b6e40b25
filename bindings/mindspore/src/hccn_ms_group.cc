// A MindSpore communication group over an hccn communicator.

#include <algorithm>

#include "hccn_ms_lib.h"

namespace hccn_ms {

HccnGroup::HccnGroup(const std::string &name, const std::vector<uint32_t> &group_ranks, uint32_t global_rank,
                     uint32_t local_group_rank, uint32_t local_group_size, hccn_comm *world,
                     std::mutex *world_ops)
    : CommunicationGroup(name, group_ranks, global_rank, local_group_rank, local_group_size),
      world_(world),
      world_ops_(world_ops),
      ops_(name == kWorldGroup ? world_ops : &own_ops_) {}

HccnGroup::~HccnGroup() { (void)Finalize(); }

bool HccnGroup::Initialize(void *) {
  std::lock_guard<std::mutex> lock(*ops_);
  if (comm_ != nullptr) return true;
  if (name_ == kWorldGroup) {
    comm_ = world_;
    initialized_ = true;
    return true;
  }
  if (std::find(group_ranks_.begin(), group_ranks_.end(), global_rank_) == group_ranks_.end()) {
    return Report("group " + name_ + ": rank " + std::to_string(global_rank_) +
                  " is not one of its ranks; only members may create a group");
  }
  try {
    hccn_comm *group = nullptr;
    std::lock_guard<std::mutex> world_lock(*world_ops_);  // hccn_new_group talks over the world
    hccn::check(hccn_new_group(world_, group_ranks_.data(), uint32_t(group_ranks_.size()), &group),
                "hccn_new_group");
    owned_.emplace(group);
    comm_ = group;
    initialized_ = true;
    return true;
  } catch (const std::exception &e) {
    return Report("creating group " + name_ + ": " + e.what());
  }
}

bool HccnGroup::Finalize() {
  std::lock_guard<std::mutex> lock(*ops_);
  comm_ = nullptr;
  owned_.reset();  // hccn_comm_destroy for groups other than the world
  initialized_ = false;
  return true;
}

void *HccnGroup::GenerateRootInfo(size_t *root_info_size) {
  if (root_info_size != nullptr) *root_info_size = sizeof(root_info_);
  return &root_info_;
}

}  // namespace hccn_ms
