// torchrun's error files, so a launcher can say why a job failed. A worker that fails writes its message to the
// file $TORCHELASTIC_ERROR_FILE names (JSON, as torchrun's workers write it: {"message": {"message": TEXT,
// "extraInfo": {"timestamp": SECONDS}}}); `shardtrain launch` (or torchrun) reads the first failed rank's file and
// reports it as the job's root cause.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace shardtrain::launch {

// Writes `message` to $TORCHELASTIC_ERROR_FILE, with `extra` beside the timestamp in extraInfo (strings, as
// torchrun's); nothing without the variable. Never throws (it runs on the way out of a failing process): a file
// that cannot be written is left out.
void record_error(const std::string& message, const std::map<std::string, std::string>& extra = {});

// The message of an error file; nullopt when there is none or it does not read.
std::optional<std::string> read_error_file(const std::string& path);
// One extraInfo entry of an error file; nullopt when the file, the entry or a string there is missing.
std::optional<std::string> read_error_info(const std::string& path, const std::string& key);

}  // namespace shardtrain::launch
