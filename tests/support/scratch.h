// Places for a test to write: a directory of its own, and a small full-able disk.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <string>

#include "shardtrain/io/files.h"

namespace shardtrain::testing {

// A new directory under /tmp named `prefix`XXXXXX, removed with everything in it when this goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "shardtrain_test_") {
    std::string pattern = "/tmp/" + prefix + "XXXXXX";
    path = ::mkdtemp(pattern.data());
  }
  ~TempDir() { io::remove_tree(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

// A tmpfs of `size` ("64k", "3m": mount's -o size) at `path` (made when missing), for writes that must find the
// disk full; unmounted (lazily: a process may still hold a file there) when this goes, also when an assertion ends
// the test early. Mounting needs root: where it fails, mounted() is false and the test skips.
class SmallDisk {
 public:
  SmallDisk(std::string path, const std::string& size) : path_(std::move(path)) {
    io::make_directories(path_);
    mounted_ = std::system(("mount -t tmpfs -o size=" + size + " tmpfs " + path_ + " 2>/dev/null").c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) [[maybe_unused]] const int status = std::system(("umount -l " + path_).c_str());
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  bool mounted() const { return mounted_; }

 private:
  std::string path_;
  bool mounted_ = false;
};

}  // namespace shardtrain::testing
