// The staging copy's check for NaN and Inf (lib/core/src/ckpt/copy_checked.h): every element position of every
// dtype it reads — the 16-byte loop's lanes and the tail after it — with NaN, +Inf and -Inf, against finite
// extremes that must pass (the largest, the smallest subnormal, -0); what it does not read is copied and said so.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "ckpt/copy_checked.h"

namespace shardtrain::ckpt {
namespace {

// The largest finite value and the smallest subnormal of `dtype`, as doubles.
std::pair<double, double> extremes(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return {std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
    case at::kBFloat16:
      return {static_cast<float>(std::numeric_limits<c10::BFloat16>::max()),
              static_cast<float>(std::numeric_limits<c10::BFloat16>::denorm_min())};
    case at::kHalf:
      return {static_cast<float>(std::numeric_limits<c10::Half>::max()),
              static_cast<float>(std::numeric_limits<c10::Half>::denorm_min())};
    default: return {std::numeric_limits<double>::max(), std::numeric_limits<double>::denorm_min()};
  }
}

at::Tensor copied(const at::Tensor& src, Finiteness& seen) {
  at::Tensor dst = at::empty_like(src);
  seen = copy_checked(dst.data_ptr(), src.data_ptr(), src.nbytes(), src.scalar_type());
  return dst;
}

TEST(CopyChecked, FindsEveryNonFiniteElementOfEachFloatingDtype) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    for (const int64_t n : {1, 7, 8, 9, 33, 1000}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " x " + std::to_string(n));
      // Finite extremes: nothing found, the bytes copied.
      at::Tensor finite = at::randn({n}, at::kDouble).to(dtype);
      const auto [largest, subnormal] = extremes(dtype);
      finite[0] = -0.0;
      finite[n - 1] = -largest;
      finite[n / 2] = subnormal;
      Finiteness seen;
      EXPECT_TRUE(at::equal(copied(finite, seen), finite));
      EXPECT_EQ(seen, Finiteness::FINITE);
      for (int64_t at = 0; at < n; ++at) {
        for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                 -std::numeric_limits<double>::infinity()}) {
          at::Tensor t = finite.clone();
          t[at] = bad;
          const at::Tensor out = copied(t, seen);
          EXPECT_EQ(seen, Finiteness::NOT_FINITE) << "position " << at << " value " << bad;
          EXPECT_EQ(std::memcmp(out.data_ptr(), t.data_ptr(), t.nbytes()), 0);
        }
      }
    }
  }
}

TEST(CopyChecked, CopiesWhatItDoesNotReadAndSaysSo) {
  const at::Tensor ids = at::arange(37, at::kLong);
  Finiteness seen;
  EXPECT_TRUE(at::equal(copied(ids, seen), ids));
  EXPECT_EQ(seen, Finiteness::FINITE);  // integers: nothing to check
  const at::Tensor f8 = at::randn({40}).to(at::kFloat8_e4m3fn);
  const at::Tensor out = copied(f8, seen);
  EXPECT_EQ(std::memcmp(out.data_ptr(), f8.data_ptr(), f8.nbytes()), 0);
  EXPECT_EQ(seen, Finiteness::UNCHECKED);
}

}  // namespace
}  // namespace shardtrain::ckpt
