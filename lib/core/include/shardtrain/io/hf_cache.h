// Hugging Face model names resolved in the local Hub cache, as from_pretrained("org/name") finds a model offline:
// the directory huggingface_hub downloads into (`huggingface-cli download org/name`), laid out as
//   <cache>/models--org--name/refs/main                 the commit the main branch points at
//   <cache>/models--org--name/snapshots/<commit>/...    config.json, weights, tokenizer (links into blobs/)
// shardtrain never downloads: a model not in the cache is an error that says how to get it.
#pragma once

#include <optional>
#include <string>

namespace shardtrain::io {

// The cache directory, as huggingface_hub chooses it: $HF_HUB_CACHE, $HUGGINGFACE_HUB_CACHE, $HF_HOME/hub,
// $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub.
std::string hf_hub_cache_dir();

// Whether `name` has the shape of a Hub repository id: "name" or "org/name", each part of letters, digits, '-',
// '_' and '.' (not "." or "..").
bool looks_like_hub_id(const std::string& name);

// The snapshot directory of model repository `repo_id` in the cache: the commit refs/main names, or without
// refs/main the one snapshot there. std::nullopt when the cache does not hold it. Throws std::runtime_error naming
// the repository when refs/main names a snapshot that is missing, or there are several and no refs/main.
std::optional<std::string> find_in_hf_cache(const std::string& repo_id);

// `name_or_path` when it exists, else the snapshot of the Hub model it names. Throws std::invalid_argument naming
// `key`, the value and the cache directory searched (and how to download it) when it is neither.
std::string resolve_hf_model(const std::string& name_or_path, const std::string& key);

}  // namespace shardtrain::io
