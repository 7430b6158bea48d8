// The sink `shardtrain train` installs under a launcher that draws progress on a terminal (SHARDTRAIN_PROGRESS=relay,
// launch/launch.h [Note: progress through the launcher]): lines as the console sink writes them, and the status
// line as one marked line on stderr for the launcher to draw in place. Terminal code stays out of the library.
#pragma once

#include <memory>

#include "shardtrain/log/log.h"

namespace shardtrain::cli {

// The relay sink when this process runs under such a launcher, else log::console_sink().
std::shared_ptr<log::Sink> train_console_sink();

}  // namespace shardtrain::cli
