// A storage's bytes copied into the staging buffer (ckpt/async_save.h) in one pass that also says whether any
// floating-point element is NaN or Inf — so that the check a save owes (no diverged state written) costs no pass of
// its own. Private to ckpt/.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace shardtrain::ckpt {

// What the pass saw of the elements (as `dtype`'s) it copied.
enum class Finiteness {
  FINITE,      // every element finite (or the dtype not floating: nothing to check)
  NOT_FINITE,  // some element NaN or Inf (its exponent bits all ones)
  UNCHECKED,   // a dtype the pass does not read (float8, complex), or a CPU it has no kernel for: check another way
};

// Copies `nbytes` from `src` to `dst` (which do not overlap; `dst` 16-byte aligned), with stores that bypass the
// cache (the copy is not read again soon), and reads the elements' exponents on the way.
Finiteness copy_checked(void* dst, const void* src, int64_t nbytes, c10::ScalarType dtype);

}  // namespace shardtrain::ckpt
