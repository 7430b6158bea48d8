// The message of an exception without c10's appended C++ backtrace, which buries the reason for a user.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace shardtrain::dist {

inline std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

}  // namespace shardtrain::dist
