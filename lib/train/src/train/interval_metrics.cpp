#include "train/interval_metrics.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>

namespace shardtrain::train {
namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The per-rank values summed over the ranks, in one all-reduce. The layout is written in pack() and read in
// RankValues's constructor only.
struct RankValues {
  double mean_loss = 0;
  double texts = 0, images = 0, flops = 0;
  std::vector<double> part_means, part_present;  // by loss name; present: 1 when this rank had the loss

  RankValues() = default;
  RankValues(const IntervalSums& s, const std::vector<std::string>& names)
      : mean_loss(s.loss / static_cast<double>(s.steps)),
        texts(static_cast<double>(s.texts)),
        images(static_cast<double>(s.images)),
        flops(s.flops) {
    for (const auto& n : names) {
      const auto it = s.parts.find(n);
      const bool had = it != s.parts.end();
      part_means.push_back(had ? it->second.first / static_cast<double>(it->second.second) : 0);
      part_present.push_back(had ? 1 : 0);
    }
  }
  std::vector<double> pack() const {
    std::vector<double> out = {mean_loss, texts, images, flops};
    out.insert(out.end(), part_means.begin(), part_means.end());
    out.insert(out.end(), part_present.begin(), part_present.end());
    return out;
  }
  static RankValues unpack(const std::vector<double>& v, size_t parts) {
    RankValues r;
    r.mean_loss = v[0], r.texts = v[1], r.images = v[2], r.flops = v[3];
    r.part_means.assign(v.begin() + 4, v.begin() + 4 + static_cast<std::ptrdiff_t>(parts));
    r.part_present.assign(v.begin() + 4 + static_cast<std::ptrdiff_t>(parts), v.end());
    return r;
  }
};

std::vector<double> all_reduce(const std::vector<double>& values, dist::ReduceOp op, const dist::Communicator& world,
                               const c10::Device& device) {
  at::Tensor t = at::tensor(values, at::kDouble).to(device);
  world.all_reduce(t, op).wait();
  t = t.cpu().contiguous();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

}  // namespace

void IntervalSums::add(const StepTotals& step, bool timed) {
  steps += 1;
  loss += step.loss;
  if (step.stepped) grad_norm += step.grad_norm;  // a skipped step's norm is inf or NaN
  for (const auto& [k, v] : step.parts) parts[k].first += v, parts[k].second += 1;
  if (timed) {
    texts += step.texts, images += step.images;
    flops += step.flops, seconds += step.seconds;
  }
}

IntervalMetrics reduce_interval(const IntervalSums& sums, const std::vector<std::string>& loss_names,
                                double peak_memory_gib, double peak_tflops, const dist::Communicator& world,
                                const c10::Device& device) {
  const double W = world.size();
  const RankValues total = RankValues::unpack(
      all_reduce(RankValues(sums, loss_names).pack(), dist::ReduceOp::SUM, world, device), loss_names.size());
  const double seconds = all_reduce({sums.seconds}, dist::ReduceOp::MAX, world, device)[0];
  std::vector<double> peaks(static_cast<size_t>(world.size()), 0.0);
  peaks[static_cast<size_t>(world.rank())] = peak_memory_gib;

  IntervalMetrics m;
  m.loss = total.mean_loss / W;
  for (size_t i = 0; i < loss_names.size(); ++i) {
    if (total.part_present[i] > 0) m.parts[loss_names[i]] = total.part_means[i] / total.part_present[i];
  }
  m.grad_norm = sums.grad_norm / static_cast<double>(sums.steps);
  if (seconds > 0) {
    m.texts_per_second = total.texts / seconds, m.images_per_second = total.images / seconds;
    m.items_per_second = m.texts_per_second + m.images_per_second;
    m.tflops_per_rank = total.flops / W / seconds / 1e12;
    m.mfu = m.tflops_per_rank / peak_tflops;
  } else {
    m.items_per_second = m.texts_per_second = m.images_per_second = m.tflops_per_rank = m.mfu = NAN;
  }
  m.peak_memory_gib = all_reduce(peaks, dist::ReduceOp::SUM, world, device);
  return m;
}

double measure_peak_tflops(const c10::Device& device) {
  const bool cuda = device.is_cuda();
  const int64_t n = cuda ? 8192 : 1024, reps = cuda ? 10 : 1;
  const auto dtype = cuda ? at::kBFloat16 : at::kFloat;
  // Varied operands made without the random streams (the run's stay untouched): on GPUs, constant or zero
  // operands multiply measurably faster than data does.
  auto operand = [&](double salt) {
    return at::arange(n * n, at::TensorOptions().device(device).dtype(at::kFloat))
        .add_(salt).remainder_(13).sub_(6).mul_(0.05).view({n, n}).to(dtype);
  };
  const at::Tensor a = operand(0), b = operand(5);
  at::Tensor c = at::empty({n, n}, a.options());
  // Waits for the device by reading one number (not by copying the product to the host, which costs more than
  // the product itself: 128 MB over PCIe against 1.4 ms of an H100's tensor cores).
  auto finish = [&] {
    if (cuda) (void)c.sum().item<double>();
  };
  at::matmul_out(c, a, b);  // warm-up: the BLAS handle and workspace
  finish();
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const double t0 = seconds_now();
    for (int64_t r = 0; r < reps; ++r) at::matmul_out(c, a, b);
    finish();
    best = std::max(best, 2.0 * n * n * n * reps / (seconds_now() - t0) / 1e12);
  }
  return best;
}

}  // namespace shardtrain::train
