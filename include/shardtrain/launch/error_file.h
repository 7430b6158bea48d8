// torchrun's error files, so a launcher can say why a job failed. A worker that fails writes its message to the
// file $TORCHELASTIC_ERROR_FILE names (JSON, as torchrun's workers write it: {"message": {"message": TEXT,
// "extraInfo": {"timestamp": SECONDS}}}); `shardtrain launch` (or torchrun) reads the first failed rank's file and
// reports it as the job's root cause.
#pragma once

#include <optional>
#include <string>

namespace shardtrain::launch {

// Writes `message` to $TORCHELASTIC_ERROR_FILE; nothing without the variable. Never throws (it runs on the way out
// of a failing process): a file that cannot be written is left out.
void record_error(const std::string& message);

// The message of an error file; nullopt when there is none or it does not read.
std::optional<std::string> read_error_file(const std::string& path);

}  // namespace shardtrain::launch
