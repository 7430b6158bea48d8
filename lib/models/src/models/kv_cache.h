// The KV caches of a model while it generates (private to the models layer): one blocks.h KvCache attached to each
// attention module under the model for the lifetime of a KvCaches, detached when it is destroyed.
#pragma once

#include <memory>
#include <vector>

#include "shardtrain/models/blocks.h"

namespace shardtrain::models {

class KvCaches {
 public:
  // Throws std::invalid_argument when `model` has no attention module, or one already has a cache (two
  // generations at once on one model).
  explicit KvCaches(torch::nn::Module& model);
  ~KvCaches();
  // Row i of every cache becomes row rows[i] (rows (B) int64): beam search's reordering.
  void reorder(const at::Tensor& rows);
  KvCaches(const KvCaches&) = delete;
  KvCaches& operator=(const KvCaches&) = delete;

 private:
  std::vector<AttentionImpl*> modules_;
  std::vector<std::unique_ptr<KvCache>> caches_;
};

}  // namespace shardtrain::models
