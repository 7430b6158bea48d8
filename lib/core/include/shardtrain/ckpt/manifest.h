// A checkpoint's manifest: manifest.json, the last file written into a checkpoint before it is renamed into place,
// lists every other file of the checkpoint with its size in bytes and its XXH3-64 checksum, and says whose it is:
//
//   {"format": "shardtrain.manifest.v1", "run_id": "3f2a...", "step": 100, "world_size": 4,
//    "config_hash": "9c1e...", "files": [{"path": "model/...", "size": 1048576, "xxh3": "0123456789abcdef"}, ...]}
//
// A checkpoint verifies when its manifest reads, names the step of its directory, and every file it lists has the
// listed size and checksum with no file beside them. Flipped bytes, a truncated file, a shard copied from another
// step and a file left over from elsewhere all fail, naming the file. XXH3 (Debian's libxxhash-dev, header only)
// hashes at memory speed, so verifying costs about one read of the checkpoint.
//
// The run id tells runs apart: pruning deletes only checkpoints of its own run, and a restarted job resumes only
// its own (train/run_checkpoint.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::ckpt {

struct ManifestFile {
  std::string path;  // relative to the checkpoint directory
  int64_t size = 0;  // bytes
  uint64_t xxh3 = 0; // XXH3-64 of the contents, seed 0
};

struct Manifest {
  std::string run_id;       // the run that wrote it
  int64_t step = 0;
  int64_t world_size = 1;
  std::string config_hash;  // XXH3-64 of the run's config YAML, hex
  std::vector<ManifestFile> files;  // sorted by path
};

inline constexpr const char* kManifestName = "manifest.json";

// Every regular file below `dir`, relative and sorted ("model/x.pt"), the manifest itself left out.
std::vector<std::string> checkpoint_files(const std::string& dir);

// Hashes `files` (relative to `dir`) into entries.
std::vector<ManifestFile> describe_files(const std::string& dir, const std::vector<std::string>& files);

// Writes `<dir>/manifest.json` atomically. Reads it back; throws std::runtime_error naming the file and what is
// wrong (missing, not JSON, another format, a missing field).
void write_manifest(const std::string& dir, const Manifest& manifest);
Manifest read_manifest(const std::string& dir);

// What is wrong with a checkpoint, "" when nothing is. Checks the manifest (readable, of the directory's step),
// the files listed at positions i with i % stride == offset (several processes share the reading), and, at offset
// 0, that no file is there beside the listed ones. Names the file (relative to `dir`) and the fault:
// "model/x.pt: 1000 bytes, the manifest says 4096 (truncated)".
std::string verify_files(const std::string& dir, int offset = 0, int stride = 1);

}  // namespace shardtrain::ckpt
