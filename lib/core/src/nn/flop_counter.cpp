#include "shardtrain/nn/flop_counter.h"

#include <ATen/record_function.h>

#include <cstring>
#include <stdexcept>
#include <vector>

namespace shardtrain::nn {
namespace {

// RecordFunction takes a plain function pointer, so the counter the callback adds to is found through the thread:
// the innermost live FlopCounter of this thread (each counter adds to the one it is nested in).
thread_local FlopCounter* innermost = nullptr;

using Inputs = c10::ArrayRef<const c10::IValue>;

std::vector<int64_t> shape(const Inputs& in, size_t i) {
  if (i >= in.size() || !in[i].isTensor()) return {};
  const at::Tensor& t = in[i].toTensor();
  return t.defined() ? t.sizes().vec() : std::vector<int64_t>{};
}

double product(const std::vector<int64_t>& dims, size_t from = 0) {
  double p = 1;
  for (size_t i = from; i < dims.size(); ++i) p *= static_cast<double>(dims[i]);
  return p;
}

// (..., m, k) x (..., k, n): 2 m k n per leading index.
double product_flops(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() < 2 || b.size() < 2) return 0;
  return 2 * product(a) * static_cast<double>(b.back());
}

// Fused attention: q (B, H, S, D), k (B, H', S', D), v (B, H', S', D'): 2 B H S S' (D + D').
double attention_flops(const std::vector<int64_t>& q, const std::vector<int64_t>& k, const std::vector<int64_t>& v) {
  if (q.size() < 2 || k.size() < 2 || v.empty()) return 0;
  const double rows = product(q) / static_cast<double>(q.back());  // B H S
  return 2 * rows * static_cast<double>(k[k.size() - 2]) * static_cast<double>(q.back() + v.back());
}

// Convolution of input (N, C, spatial...) by weight (Cout, C / groups, kernel...) at the op's stride, padding and
// dilation: 2 x output elements x weight elements per output channel. Transposed: 2 x input elements x weight
// elements per input channel (weight (C, Cout / groups, kernel...)).
double convolution_flops(const Inputs& in) {
  const std::vector<int64_t> x = shape(in, 0), w = shape(in, 1);
  if (x.size() < 3 || w.size() != x.size()) return 0;
  if (in[6].toBool()) return 2 * product(x) * product(w, 1);
  const std::vector<int64_t> stride = in[3].toIntVector(), padding = in[4].toIntVector(), dilation = in[5].toIntVector();
  double out = static_cast<double>(x[0] * w[0]);
  for (size_t i = 2; i < x.size(); ++i) {
    auto at = [](const std::vector<int64_t>& v, size_t j) { return v.size() == 1 ? v[0] : v[j]; };
    const size_t j = i - 2;
    out *= static_cast<double>((x[i] + 2 * at(padding, j) - at(dilation, j) * (w[i] - 1) - 1) / at(stride, j) + 1);
  }
  return 2 * out * product(w, 1);
}

// convolution_backward(grad_output, input, weight, ..., transposed (7), ..., output_mask (10)): one forward's
// worth for the input gradient and one for the weight's, each when asked for.
double convolution_backward_flops(const Inputs& in) {
  const std::vector<int64_t> grad = shape(in, 0), x = shape(in, 1), w = shape(in, 2);
  if (grad.size() < 3 || w.size() < 3) return 0;
  const double one = 2 * (in[7].toBool() ? product(x) : product(grad)) * product(w, 1);
  const auto mask = in[10].toBoolList();
  return (mask.get(0) ? one : 0) + (mask.get(1) ? one : 0);
}

bool is(const char* name, const char* op) { return std::strcmp(name, op) == 0; }

bool is_attention(const char* name) {
  for (const char* op : {"aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention",
                         "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention"}) {
    if (is(name, op)) return true;
  }
  return false;
}

bool is_attention_backward(const char* name) {
  const size_t n = std::strlen(name);
  static constexpr char kSuffix[] = "_backward";
  if (n <= sizeof(kSuffix) - 1 || std::strcmp(name + n - (sizeof(kSuffix) - 1), kSuffix) != 0) return false;
  return is_attention(std::string(name, n - (sizeof(kSuffix) - 1)).c_str());
}

double flops_of(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (std::strncmp(name, "aten::", 6) != 0) return 0;
  const Inputs in = fn.inputs();
  if (is(name, "aten::mm") || is(name, "aten::bmm")) return product_flops(shape(in, 0), shape(in, 1));
  if (is(name, "aten::addmm") || is(name, "aten::baddbmm")) return product_flops(shape(in, 1), shape(in, 2));
  if (is(name, "aten::mv")) return 2 * product(shape(in, 0));
  if (is(name, "aten::addmv")) return 2 * product(shape(in, 1));
  if (is(name, "aten::convolution")) return convolution_flops(in);
  if (is(name, "aten::convolution_backward")) return convolution_backward_flops(in);
  if (is_attention(name)) return attention_flops(shape(in, 0), shape(in, 1), shape(in, 2));
  if (is_attention_backward(name)) return 2 * attention_flops(shape(in, 1), shape(in, 2), shape(in, 3));
  return 0;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (innermost != nullptr) {
    const double flops = flops_of(fn);
    if (flops > 0) innermost->add(fn.name(), flops);
  }
  return nullptr;
}

}  // namespace

// The outermost counter of the thread registers the callback; nested ones receive through it.
FlopCounter::FlopCounter() : outer_(innermost) {
  innermost = this;
  if (outer_ == nullptr) {
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_start).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  }
}

FlopCounter::~FlopCounter() {
  if (outer_ == nullptr) at::removeCallback(handle_);
  innermost = outer_;
}

void FlopCounter::add(const char* op, double flops) {
  total_ += flops;
  by_op_[op] += flops;
  if (outer_ != nullptr) outer_->add(op, flops);
}

}  // namespace shardtrain::nn
