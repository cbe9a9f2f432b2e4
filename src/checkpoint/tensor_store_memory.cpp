// TensorStore over in-memory tensors: the same lookups and checks as for files, so the drafter
// loads random benchmark weights through exactly the path real checkpoints take.
#include "checkpoint/safetensors.h"
#include "core/checked.h"
#include "core/error.h"

namespace tpdraft::model {

std::shared_ptr<TensorStore> TensorStore::from_memory(const std::string& label, std::vector<OwnedTensor> tensors) {
  auto store = std::make_shared<TensorStore>();
  store->source_ = label;
  store->owned_ = std::move(tensors);
  for (const OwnedTensor& t : store->owned_) {
    auto info = std::make_unique<TensorInfo>();
    info->name = t.name;
    info->dtype = t.dtype;
    info->shape = t.shape;
    info->data = t.bytes.data();
    info->nbytes = t.bytes.size();
    info->file = label;
    // The loader trusts shape x dtype size as the tensor's extent: it must be these bytes exactly.
    const size_t expected = checked_bytes(t.shape, dtype_size(t.dtype), "{}: tensor '{}'", label, t.name);
    TPDRAFT_CHECK(expected == t.bytes.size(), "{}: tensor '{}' holds {} bytes, expected {} for shape {} of {}", label,
                  t.name, t.bytes.size(), expected, info->shape_str(), dtype_name(t.dtype));
    const std::string canon = t.name.rfind("model.", 0) == 0 ? t.name.substr(6) : t.name;
    TPDRAFT_CHECK(store->by_name_.emplace(canon, info.get()).second, "{}: tensor '{}' appears twice", label, canon);
    store->owned_info_.push_back(std::move(info));
  }
  return store;
}

}  // namespace tpdraft::model
