#include "optim/anyprecision_kernel.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

// The loops are compiled twice on x86-64, for AVX2 with FMA (8 floats a vector) and for the baseline (SSE2, 4),
// and the CPU's features pick one; elsewhere once, for the target the compiler was given. This file is compiled
// with -fno-math-errno so that sqrt vectorises.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SHARDTRAIN_X86_DISPATCH 1
#endif
#define SHARDTRAIN_INLINE inline __attribute__((always_inline))

namespace shardtrain::optim {
namespace {

constexpr int64_t kGrain = 1 << 16;  // the fewest elements a thread is given

// bf16 tensors are read and written as their bits, float32 ones as floats.
using Bf16Bits = uint16_t;

// c10's own bf16 conversions (round to nearest even, NaN to a quiet NaN), inline and vectorisable.
SHARDTRAIN_INLINE float widen(Bf16Bits h) { return c10::detail::f32_from_bits(h); }
SHARDTRAIN_INLINE Bf16Bits narrow(float f) { return c10::detail::round_to_nearest_even(f); }

SHARDTRAIN_INLINE float load(const float* t, int64_t i) { return t[i]; }
SHARDTRAIN_INLINE float load(const Bf16Bits* t, int64_t i) { return widen(t[i]); }
SHARDTRAIN_INLINE void store(float* t, int64_t i, float x) { t[i] = x; }
SHARDTRAIN_INLINE void store(Bf16Bits* t, int64_t i, float x) { t[i] = narrow(x); }
// x as a tensor of t's dtype would hold it.
SHARDTRAIN_INLINE float rounded(const float*, float x) { return x; }
SHARDTRAIN_INLINE float rounded(const Bf16Bits*, float x) { return widen(narrow(x)); }

struct Scalars {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bias_correction2, eps, neg_step_size;
};

// LibTorch AdamW's operations in its order, on float32 values: decay, moments (mul_ then add_ / addcmul_), the
// denominator, addcdiv_. With Kahan summation the update goes into the compensation first, the parameter takes
// the compensation rounded to its own dtype, and the compensation keeps what that rounding dropped.
template <bool kKahan, typename P, typename M, typename V, typename C>
SHARDTRAIN_INLINE void update(P* __restrict p, const P* __restrict g, M* __restrict m, V* __restrict v,
                              C* __restrict c, int64_t n, const Scalars& scalars) {
  const Scalars s = scalars;  // locals, so that stores through the pointers cannot be taken to change them
  for (int64_t i = 0; i < n; ++i) {
    const float gi = load(g, i);
    const float mi = load(m, i) * s.beta1 + s.one_minus_beta1 * gi;
    const float vi = load(v, i) * s.beta2 + s.one_minus_beta2 * gi * gi;
    store(m, i, mi);
    store(v, i, vi);
    const float update = s.neg_step_size * (mi / (std::sqrt(vi) / s.sqrt_bias_correction2 + s.eps));
    const float decayed = load(p, i) * s.decay;
    if constexpr (kKahan) {
      const float ci = load(c, i) + update;
      const float moved = rounded(p, decayed + ci);
      store(c, i, ci + (decayed - moved));
      store(p, i, moved);
    } else {
      store(p, i, decayed + update);
    }
  }
}

// Elements [begin, begin + n) of one parameter's tensors.
using UpdateFn = void (*)(void* p, const void* g, void* m, void* v, void* c, int64_t begin, int64_t n,
                          const Scalars& s);

#define SHARDTRAIN_UPDATE_BODY                                                                          \
  update<kKahan>(static_cast<P*>(p) + begin, static_cast<const P*>(g) + begin, static_cast<M*>(m) + begin, \
                 static_cast<V*>(v) + begin, static_cast<C*>(c) + (c ? begin : 0), n, s)

template <bool kKahan, typename P, typename M, typename V, typename C>
void update_baseline(void* p, const void* g, void* m, void* v, void* c, int64_t begin, int64_t n,
                     const Scalars& s) {
  SHARDTRAIN_UPDATE_BODY;
}

#ifdef SHARDTRAIN_X86_DISPATCH
template <bool kKahan, typename P, typename M, typename V, typename C>
__attribute__((target("avx2,fma"))) void update_avx2(void* p, const void* g, void* m, void* v, void* c,
                                                     int64_t begin, int64_t n, const Scalars& s) {
  SHARDTRAIN_UPDATE_BODY;
}
#endif
#undef SHARDTRAIN_UPDATE_BODY

bool has_avx2() {
#ifdef SHARDTRAIN_X86_DISPATCH
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// The instantiation for the parameter's, moments' and compensation's dtypes (bf16[i] for P, M, V, C in turn).
template <bool kKahan, typename... Ts>
UpdateFn choose(bool avx2, const bool* bf16) {
  if constexpr (sizeof...(Ts) == 4) {
#ifdef SHARDTRAIN_X86_DISPATCH
    if (avx2) return &update_avx2<kKahan, Ts...>;
#endif
    (void)avx2;
    return &update_baseline<kKahan, Ts...>;
  } else if constexpr (sizeof...(Ts) == 3 && !kKahan) {
    return choose<kKahan, Ts..., float>(avx2, bf16);  // no compensation
  } else {
    return *bf16 ? choose<kKahan, Ts..., Bf16Bits>(avx2, bf16 + 1) : choose<kKahan, Ts..., float>(avx2, bf16 + 1);
  }
}

bool is_bf16(const at::Tensor& t) { return t.defined() && t.scalar_type() == at::kBFloat16; }

bool float_or_bf16(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
}

struct Job {
  UpdateFn fn;
  void *p, *m, *v, *c;
  const void* g;
  Scalars k;
  int64_t first, n;  // the job's elements in the concatenation of all
};

// Elements [begin, end) of the concatenation of `jobs`.
void run_range(const std::vector<Job>& jobs, int64_t begin, int64_t end) {
  auto job = std::upper_bound(jobs.begin(), jobs.end(), begin, [](int64_t e, const Job& j) { return e < j.first; });
  for (--job; job != jobs.end() && job->first < end; ++job) {
    const int64_t from = std::max<int64_t>(begin - job->first, 0), to = std::min(end - job->first, job->n);
    if (to > from) job->fn(job->p, job->g, job->m, job->v, job->c, from, to - from, job->k);
  }
}

}  // namespace

bool fused_anyprecision_takes(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                              const at::Tensor& exp_avg_sq, const at::Tensor& compensation) {
  for (const at::Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq, &compensation}) {
    if (t == &compensation && !t->defined()) continue;
    if (!t->defined() || !t->device().is_cpu() || t->layout() != at::kStrided || !t->is_contiguous() ||
        !float_or_bf16(*t) || t->numel() != param.numel()) {
      return false;
    }
  }
  return grad.scalar_type() == param.scalar_type();
}

void fused_anyprecision_step(const std::vector<AnyPrecisionTensors>& params) {
  const bool avx2 = has_avx2();
  std::vector<Job> jobs;
  int64_t total = 0;
  for (const AnyPrecisionTensors& t : params) {
    const AdamWStepScalars& s = t.scalars;
    const Scalars k{static_cast<float>(s.decay),
                    static_cast<float>(s.beta1),
                    static_cast<float>(1 - s.beta1),
                    static_cast<float>(s.beta2),
                    static_cast<float>(1 - s.beta2),
                    static_cast<float>(s.sqrt_bias_correction2),
                    static_cast<float>(s.eps),
                    static_cast<float>(-s.step_size)};
    const bool kahan = t.compensation.defined();
    const bool bf16[] = {is_bf16(t.param), is_bf16(t.exp_avg), is_bf16(t.exp_avg_sq), is_bf16(t.compensation)};
    const UpdateFn fn = kahan ? choose<true>(avx2, bf16) : choose<false>(avx2, bf16);
    jobs.push_back({fn, t.param.data_ptr(), t.exp_avg.data_ptr(), t.exp_avg_sq.data_ptr(),
                    kahan ? t.compensation.data_ptr() : nullptr, t.grad.data_ptr(), k, total, t.param.numel()});
    total += t.param.numel();
  }
  auto run = [&](int64_t begin, int64_t end) { run_range(jobs, begin, end); };
  if (total == 0) return;
  const int64_t threads = std::clamp<int64_t>((total + kGrain - 1) / kGrain, 1, at::get_num_threads());
  std::mutex mutex;
  std::condition_variable done;
  int64_t running = threads - 1;
  for (int64_t t = 1; t < threads; ++t) {
    at::launch([&, t] {
      run(total * t / threads, total * (t + 1) / threads);
      std::lock_guard<std::mutex> lock(mutex);
      if (--running == 0) done.notify_one();
    });
  }
  run(0, total / threads);
  std::unique_lock<std::mutex> lock(mutex);
  done.wait(lock, [&] { return running == 0; });
}

}  // namespace shardtrain::optim
