// Send and receive with torch's tags. hccn's messages between two ranks match in the order they
// were sent; tags are matched here. Every send is a header (magic, tag, bytes) and then the
// payload, queued on the group's stream like a collective (sends complete once hccn has the
// bytes, never waiting for the receiver). Every receive runs on a stream of its own source, in
// a callback that reads headers in arrival order: a message whose tag is wanted lands in the
// receive's tensor, any other waits in a stash for the receive of its tag. A receive that waits
// therefore holds up only later receives from the same source.
#include "backend.h"
#include "tensors.h"

#include <cstring>

namespace hccn_torch {

namespace {

struct Header {
  uint32_t magic;
  uint32_t version;
  int64_t tag;
  uint64_t bytes;
};

constexpr uint32_t kMagic = 0x54434348;  // "HCCT"
constexpr uint32_t kVersion = 1;

std::string from(int src, int64_t tag) {
  return "recv from rank " + std::to_string(src) + " with tag " + std::to_string(tag);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  at::Tensor& t = single(tensors, "send");
  check_peer(dst, "send: destination");
  if (dst == rank_) invalid("send: a rank cannot send to itself");
  at::Tensor d = dense(t);
  auto work = make_work(c10d::OpType::SEND, tensors);
  work->keep = {d};
  work->scratch.resize(sizeof(Header));
  const Header h{kMagic, kVersion, tag, uint64_t(d.nbytes())};
  std::memcpy(work->scratch.data(), &h, sizeof h);
  void* header = work->scratch.data();
  return enqueue_on(-1, work, [&](hccn_stream* s) {
    check(api().hccn_send(header, sizeof(Header), HCCN_UINT8, uint32_t(dst), comm_, s), comm_);
    if (h.bytes > 0) check(api().hccn_send(d.data_ptr(), h.bytes, HCCN_UINT8, uint32_t(dst), comm_, s), comm_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCN::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  at::Tensor& t = single(tensors, "recv");
  check_peer(src, "recv: source");
  if (src == rank_) invalid("recv: a rank cannot receive from itself");
  at::Tensor d = dense(t);
  auto work = make_work(c10d::OpType::RECV, tensors);
  work->keep = {d};
  if (is_staged(d, t))
    work->finish = [d, t]() mutable { t.copy_(d); };
  void* dst = d.data_ptr();
  const uint64_t bytes = d.nbytes();
  work->host_step = [this, src, tag, dst, bytes]() { receive_matching(src, tag, dst, bytes); };
  // Nothing to queue but the callback, which does the receiving.
  return enqueue_on(src, work, [](hccn_stream*) {});
}

// On the receive stream of `src`: the next message from `src` with `tag` into `dst`.
void ProcessGroupHCCN::receive_matching(int src, int64_t tag, void* dst, uint64_t bytes) {
  auto& waiting = stash_[size_t(src)];
  auto it = waiting.find(tag);
  if (it != waiting.end() && !it->second.empty()) {
    std::vector<uint8_t> msg = std::move(it->second.front());
    it->second.pop_front();
    if (msg.size() != bytes)
      invalid(from(src, tag) + ": the message has " + std::to_string(msg.size()) + " bytes, the tensor " +
              std::to_string(bytes));
    if (bytes > 0) std::memcpy(dst, msg.data(), bytes);
    return;
  }
  for (;;) {
    Header h{};
    check(api().hccn_recv(&h, sizeof h, HCCN_UINT8, uint32_t(src), comm_, nullptr), comm_);
    if (h.magic != kMagic || h.version != kVersion)
      invalid(from(src, tag) + ": rank " + std::to_string(src) +
              " sent a message that does not come from this backend's send (hccn.send on the same "
              "communicator, or another version of hccn.torch)");
    if (h.tag == tag && h.bytes == bytes) {
      if (bytes > 0) check(api().hccn_recv(dst, bytes, HCCN_UINT8, uint32_t(src), comm_, nullptr), comm_);
      return;
    }
    // Another tag's message (or a wrong size for this one): taken off the link in any case, so
    // that the messages after it stay readable.
    std::vector<uint8_t> msg(h.bytes);
    if (h.bytes > 0) check(api().hccn_recv(msg.data(), h.bytes, HCCN_UINT8, uint32_t(src), comm_, nullptr), comm_);
    if (h.tag == tag)
      invalid(from(src, tag) + ": the message has " + std::to_string(h.bytes) + " bytes, the tensor " +
              std::to_string(bytes));
    waiting[h.tag].push_back(std::move(msg));
  }
}

}  // namespace hccn_torch
