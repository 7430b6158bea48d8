// The autocast state of one device type set for a scope and put back after it (private to the nn layer: the
// autocast interceptor, and the activation-checkpoint replay, which runs under the autocast state of its forward).
#pragma once

#include <ATen/autocast_mode.h>

namespace shardtrain::nn {

// Sets autocast for one device type for the life of the guard, then puts back what was there; the cast cache is
// cleared when the outermost autocast region ends (as torch.autocast does).
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device_type, bool enabled, c10::ScalarType dtype)
      : device_type_(device_type),
        was_enabled_(at::autocast::is_autocast_enabled(device_type)),
        was_dtype_(at::autocast::get_autocast_dtype(device_type)) {
    at::autocast::set_autocast_enabled(device_type, enabled);
    at::autocast::set_autocast_dtype(device_type, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type_, was_enabled_);
    at::autocast::set_autocast_dtype(device_type_, was_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool was_enabled_;
  c10::ScalarType was_dtype_;
};

}  // namespace shardtrain::nn
