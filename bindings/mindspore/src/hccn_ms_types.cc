#include "hccn_ms_types.h"

#include <cstdio>
#include <mutex>

namespace hccn_ms {

using mindspore::TypeId;
using mindspore::device::CollectiveOpReduceType;

hccn_datatype ToHccn(TypeId type, bool reducing) {
  switch (type) {
    case TypeId::kNumberTypeInt8:
      return HCCN_INT8;
    case TypeId::kNumberTypeInt16:
      return HCCN_INT16;
    case TypeId::kNumberTypeInt:  // MindSpore's "int" is 32 bits
    case TypeId::kNumberTypeInt32:
      return HCCN_INT32;
    case TypeId::kNumberTypeInt64:
      return HCCN_INT64;
    case TypeId::kNumberTypeUInt8:
      return HCCN_UINT8;
    case TypeId::kNumberTypeUInt16:
      return HCCN_UINT16;
    case TypeId::kNumberTypeUInt:
    case TypeId::kNumberTypeUInt32:
      return HCCN_UINT32;
    case TypeId::kNumberTypeUInt64:
      return HCCN_UINT64;
    case TypeId::kNumberTypeFloat16:
      return HCCN_FP16;
    case TypeId::kNumberTypeFloat:  // MindSpore's "float" is 32 bits
    case TypeId::kNumberTypeFloat32:
      return HCCN_FP32;
    case TypeId::kNumberTypeFloat64:
    case TypeId::kNumberTypeDouble:
      return HCCN_FP64;
    case TypeId::kNumberTypeBFloat16:
      return HCCN_BF16;
    case TypeId::kNumberTypeBool:
      // One byte each: gathering or broadcasting them is moving bytes; summing them is not.
      if (!reducing) return HCCN_UINT8;
      throw Refused("hccn has no reduction for bool tensors");
    default:
      throw Refused("hccn has no datatype for MindSpore TypeId " + std::to_string(int(type)));
  }
}

hccn_reduce_op ToHccn(CollectiveOpReduceType op) {
  switch (op) {
    case CollectiveOpReduceType::Reduce_Sum:
      return HCCN_SUM;
    case CollectiveOpReduceType::Reduce_Prod:
      return HCCN_PROD;
    case CollectiveOpReduceType::Reduce_Max:
      return HCCN_MAX;
    case CollectiveOpReduceType::Reduce_Min:
      return HCCN_MIN;
    case CollectiveOpReduceType::Reduce_Mean:
      return HCCN_AVG;
    default:
      throw Refused("hccn has no reduce op for MindSpore CollectiveOpReduceType " + std::to_string(int64_t(op)) +
                    " (sum, prod, max, min and mean only)");
  }
}

size_t ElementSize(hccn_datatype dt) {
  switch (dt) {
    case HCCN_INT8:
    case HCCN_UINT8:
      return 1;
    case HCCN_INT16:
    case HCCN_UINT16:
    case HCCN_FP16:
    case HCCN_BF16:
      return 2;
    case HCCN_INT32:
    case HCCN_UINT32:
    case HCCN_FP32:
      return 4;
    default:
      return 8;
  }
}

namespace {
std::mutex g_last_error_mu;
std::string g_last_error;
}  // namespace

void Remember(const std::string &message) {
  std::lock_guard<std::mutex> lock(g_last_error_mu);
  g_last_error = message;
}

bool Report(const std::string &message) {
  std::fprintf(stderr, "hccn_ms: %s\n", message.c_str());
  std::fflush(stderr);
  Remember(message);
  return false;
}

void Raise(const std::string &message) {
  (void)Report(message);
  throw std::runtime_error("hccn_ms: " + message);
}

std::string LastError() {
  std::lock_guard<std::mutex> lock(g_last_error_mu);
  return g_last_error;
}

}  // namespace hccn_ms
