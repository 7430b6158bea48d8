// torch.save's format (what torch::pickle_save returns: a zip of the pickle program and one record per tensor
// storage) written to and read from files directly, never the whole file in memory. pickle_save's bytes are a
// second copy of every tensor until they are written, and reading them back a third: a checkpoint of a rank's
// state then needs twice that state free, on CPU the whole model's (CPU training, CPU offload).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace c10 {
struct IValue;
}

namespace shardtrain::io {

// Writes `value` to `path` atomically (io::AtomicFile). Each tensor's storage is written as it is, a CPU one
// without a copy, a device one through a host copy of that storage alone (the host holds one storage at a time,
// not the whole state); views of one storage share one record, so a view writes all of its storage: give views of
// a larger buffer that the file should not hold as copies. Loads with torch::pickle_load as well as with
// load_pickle, and in Python with torch.load's defaults (weights_only=True): containers are written untagged, so
// they load back untyped (a list of ints is a List[Any]: read it with int_vector). Throws std::runtime_error naming
// the path.
void save_pickle(const std::string& path, const c10::IValue& value);

// What save_pickle or torch::pickle_save wrote, every tensor on the CPU whatever device it was saved from
// (torch.load's map_location="cpu"), its storage a view of the file mapped into memory (torch.load's mmap=True;
// copy-on-write: writing to a tensor changes only this process's copy of the page), so that loading a state from
// it into a model holds no second copy of the state; where the file cannot be mapped, each storage is read into
// memory. Throws std::runtime_error naming the path when the file is missing or is not such an archive.
c10::IValue load_pickle(const std::string& path);

// The integers of a list that load_pickle returned, typed (List[int], as files written before 2026-11-27 hold) or
// not (List[Any] of ints). Throws std::runtime_error naming `what` when it is not a list of integers.
std::vector<int64_t> int_vector(const c10::IValue& list, const std::string& what);

}  // namespace shardtrain::io
