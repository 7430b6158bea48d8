#include "shardtrain/ckpt/manifest.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>

#include "shardtrain/io/checksum.h"
#include "shardtrain/io/files.h"
#include "shardtrain/util/json_integer.h"

namespace shardtrain::ckpt {
namespace {

constexpr const char* kManifestFormat = "shardtrain.manifest.v1";

void collect(const std::string& root, const std::string& relative, std::vector<std::string>& out) {
  const std::string here = relative.empty() ? root : root + "/" + relative;
  for (const std::string& name : io::list_directory(here)) {
    const std::string rel = relative.empty() ? name : relative + "/" + name;
    if (io::is_directory(root + "/" + rel)) {
      collect(root, rel, out);
    } else if (rel != kManifestName) {
      out.push_back(rel);
    }
  }
}

// "step-00000100" -> 100; -1 for another name.
int64_t step_of_directory(const std::string& dir) {
  const std::string name = dir.substr(dir.rfind('/') + 1);
  long long step = -1;
  char rest = 0;
  if (std::sscanf(name.c_str(), "step-%lld%c", &step, &rest) != 1) return -1;
  return step;
}

}  // namespace

std::vector<std::string> checkpoint_files(const std::string& dir) {
  std::vector<std::string> out;
  collect(dir, "", out);
  return out;
}

std::vector<ManifestFile> describe_files(const std::string& dir, const std::vector<std::string>& files) {
  std::vector<ManifestFile> out;
  for (const std::string& rel : files) {
    const std::string path = dir + "/" + rel;
    out.push_back({rel, io::file_size(path), io::checksum_file(path)});
  }
  return out;
}

void write_manifest(const std::string& dir, const Manifest& m) {
  nlohmann::json j;
  j["format"] = kManifestFormat;
  j["run_id"] = m.run_id;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  j["config_hash"] = m.config_hash;
  j["files"] = nlohmann::json::array();
  for (const ManifestFile& f : m.files) j["files"].push_back({{"path", f.path}, {"size", f.size}, {"xxh3", io::to_hex(f.xxh3)}});
  const std::string text = j.dump(1);
  io::write_file_atomic(dir + "/" + kManifestName, std::vector<char>(text.begin(), text.end()));
}

Manifest read_manifest(const std::string& dir) {
  const std::string file = dir + "/" + kManifestName;
  if (!io::path_exists(file)) {
    throw std::runtime_error(file + ": missing (the save did not finish, or an older shardtrain wrote it)");
  }
  const std::vector<char> bytes = io::read_file(file);
  Manifest m;
  try {
    const nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end());
    if (j.value("format", "") != kManifestFormat) {
      throw std::runtime_error("format '" + j.value("format", "") + "', expected '" + kManifestFormat + "'");
    }
    m.run_id = j.at("run_id").get<std::string>();
    m.step = util::json_integer(j.at("step"), "step");
    m.world_size = util::json_integer(j.at("world_size"), "world_size");
    m.config_hash = j.at("config_hash").get<std::string>();
    for (const auto& f : j.at("files")) {
      const std::string hex = f.at("xxh3").get<std::string>();
      size_t used = 0;
      const uint64_t value = std::stoull(hex, &used, 16);
      if (used != hex.size() || hex.size() != 16) throw std::runtime_error("checksum '" + hex + "' is not 16 hex digits");
      const std::string path = f.at("path").get<std::string>();
      // Inside the checkpoint only: a damaged or hostile manifest must not have files elsewhere read.
      if (path.empty() || path[0] == '/' || path == ".." || path.rfind("../", 0) == 0 ||
          path.find("/../") != std::string::npos || (path.size() >= 3 && path.compare(path.size() - 3, 3, "/..") == 0)) {
        throw std::runtime_error("file path '" + path + "' leaves the checkpoint");
      }
      m.files.push_back({path, util::json_integer(f.at("size"), "size of " + path), value});
    }
  } catch (const std::exception& e) {  // JSON syntax, a missing field, a damaged number
    throw std::runtime_error(file + ": " + e.what());
  }
  return m;
}

std::string verify_files(const std::string& dir, int offset, int stride) {
  Manifest m;
  try {
    m = read_manifest(dir);
  } catch (const std::runtime_error& e) {
    const std::string text = e.what();  // "<dir>/manifest.json: ..." -> "manifest.json: ..."
    return text.rfind(dir + "/", 0) == 0 ? text.substr(dir.size() + 1) : text;
  }
  const int64_t step = step_of_directory(dir);
  if (step >= 0 && m.step != step) {
    return std::string(kManifestName) + ": step " + std::to_string(m.step) + ", the directory's is " +
           std::to_string(step) + " (copied from another checkpoint?)";
  }
  try {
    for (size_t i = static_cast<size_t>(offset); i < m.files.size(); i += static_cast<size_t>(stride)) {
      const ManifestFile& f = m.files[i];
      const std::string path = dir + "/" + f.path;
      if (!io::path_exists(path)) return f.path + ": missing";
      if (io::is_directory(path)) return f.path + ": a directory, the manifest lists a file";
      const int64_t size = io::file_size(path);
      if (size != f.size) {
        return f.path + ": " + std::to_string(size) + " bytes, the manifest says " + std::to_string(f.size) +
               (size < f.size ? " (truncated)" : "");
      }
      const uint64_t sum = io::checksum_file(path);
      if (sum != f.xxh3) {
        return f.path + ": checksum " + io::to_hex(sum) + ", the manifest says " + io::to_hex(f.xxh3) +
               " (damaged, or a file of another checkpoint)";
      }
    }
    if (offset == 0) {
      std::map<std::string, bool> listed;
      for (const ManifestFile& f : m.files) listed[f.path] = true;
      for (const std::string& rel : checkpoint_files(dir)) {
        if (!listed.count(rel)) return rel + ": not in the manifest (put there after the save)";
      }
    }
  } catch (const std::runtime_error& e) {  // a file that cannot be read
    return e.what();
  }
  return "";
}

}  // namespace shardtrain::ckpt
