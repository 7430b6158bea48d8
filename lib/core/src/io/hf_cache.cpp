#include "shardtrain/io/hf_cache.h"

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "shardtrain/io/files.h"

namespace shardtrain::io {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

bool valid_part(const std::string& part) {
  if (part.empty() || part == "." || part == "..") return false;
  for (const char c : part) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::string hf_hub_cache_dir() {
  for (const char* name : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"}) {
    if (!env(name).empty()) return env(name);
  }
  if (!env("HF_HOME").empty()) return env("HF_HOME") + "/hub";
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/huggingface/hub";
  return env("HOME") + "/.cache/huggingface/hub";
}

bool looks_like_hub_id(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos) return valid_part(name);
  return name.find('/', slash + 1) == std::string::npos && valid_part(name.substr(0, slash)) &&
         valid_part(name.substr(slash + 1));
}

std::optional<std::string> find_in_hf_cache(const std::string& repo_id) {
  namespace fs = std::filesystem;
  if (!looks_like_hub_id(repo_id)) return std::nullopt;
  std::string folder = "models--" + repo_id;
  const size_t slash = folder.find('/');
  if (slash != std::string::npos) folder.replace(slash, 1, "--");
  const fs::path repo = fs::path(hf_hub_cache_dir()) / folder;
  if (!fs::is_directory(repo / "snapshots")) return std::nullopt;
  if (fs::exists(repo / "refs" / "main")) {
    const std::vector<char> bytes = read_file((repo / "refs" / "main").string());
    const std::string commit = trimmed(std::string(bytes.begin(), bytes.end()));
    const fs::path snapshot = repo / "snapshots" / commit;
    if (commit.empty() || !fs::is_directory(snapshot)) {
      throw std::runtime_error(repo_id + ": the Hugging Face cache's refs/main names snapshot '" + commit +
                               "', which is not in " + (repo / "snapshots").string());
    }
    return snapshot.string();
  }
  std::vector<std::string> snapshots = list_directory((repo / "snapshots").string());
  if (snapshots.size() == 1) return (repo / "snapshots" / snapshots.front()).string();
  if (snapshots.empty()) return std::nullopt;
  throw std::runtime_error(repo_id + ": the Hugging Face cache holds " + std::to_string(snapshots.size()) +
                           " snapshots in " + (repo / "snapshots").string() + " and no refs/main to choose one; "
                           "give the snapshot's directory");
}

std::string resolve_hf_model(const std::string& name_or_path, const std::string& key) {
  if (path_exists(name_or_path)) return name_or_path;
  if (auto snapshot = find_in_hf_cache(name_or_path)) return *snapshot;
  if (!looks_like_hub_id(name_or_path)) {
    throw std::invalid_argument(key + ": '" + name_or_path + "' does not exist (a Hugging Face model directory, " +
                                "or a model name in the Hugging Face cache, expected)");
  }
  throw std::invalid_argument(key + ": '" + name_or_path + "' is neither a directory nor a model in the Hugging " +
                              "Face cache (" + hf_hub_cache_dir() + "; HF_HUB_CACHE or HF_HOME choose another). " +
                              "shardtrain does not download: `huggingface-cli download " + name_or_path + "` does");
}

}  // namespace shardtrain::io
