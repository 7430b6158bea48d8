#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "custom_nodes.h"
#include "shardtrain/models/layers.h"

namespace shardtrain::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Aliases of the table in forward, one per lookup and one for the projection, so that their gradients arrive
// apart: autograd adds two gradients of one tensor in place only into a dense one whose storage it holds alone, and
// adds a sparse one so only when the sparse one came first (it counts a sparse tensor as a subclass) — and the
// projection's comes first, being last in forward; two sparse gradients of one tensor it adds into a third, which
// CPU cannot do in float16. The rows (sparse) are added here into the projection's gradient instead, in place: it
// is a tensor no other node holds (tied_projection's and linear_cross_entropy's are made for it). Rows alone become
// a dense table here.
struct TiedTableFunction : public torch::autograd::Function<TiedTableFunction> {
  static variable_list forward(AutogradContext*, const at::Tensor& weight, int64_t lookups) {
    variable_list aliases;
    for (int64_t i = 0; i <= lookups; ++i) aliases.push_back(weight.alias());
    return aliases;  // the lookups', then the head's
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    at::Tensor table = std::move(grads.back());
    grads.pop_back();
    for (at::Tensor& rows : grads) {
      if (!rows.defined()) continue;
      if (!table.defined()) {
        table = rows.is_sparse() ? rows.to_dense() : std::move(rows);
      } else {
        table.add_(rows);
      }
    }
    return {table, at::Tensor()};
  }
};

// at::linear, with the table's gradient made by one mm into a tensor of its own (projection_grads). (at::linear's is
// a transposed view of its mm's result, and autograd adds into a gradient in place only when it holds the gradient's
// storage alone — a view shares it with its base — so the rows went into a third table.)
struct TiedProjection : public torch::autograd::Function<TiedProjection> {
  // x (..., C), table (V, C), bias (V) or none. Returns (..., V).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& table,
                            const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({x, table});
    ctx->saved_data["bias"] = bias.has_value();
    return at::linear(x, table, bias.value_or(at::Tensor()));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], table = in_dtype_of(saved[1], x);
    const at::Tensor grad = in_dtype_of(rows(grads[0]), x);  // (N, V)
    at::Tensor grad_x, grad_table, grad_bias;
    if (ctx->needs_input_grad(0)) grad_x = grad.mm(table).view(x.sizes());
    projection_grads(ctx, 1, grad, rows(x), grad_table, grad_bias);  // (V, C), (V)
    return {grad_x, grad_table, grad_bias};
  }
};

}  // namespace

TiedTable tie_table(const at::Tensor& weight, int64_t lookups) {
  if (lookups < 1) throw std::invalid_argument("tie_table: " + std::to_string(lookups) + " lookups (expected >= 1)");
  if (!at::GradMode::is_enabled() || !weight.requires_grad()) {
    return {std::vector<at::Tensor>(static_cast<size_t>(lookups), weight), weight};
  }
  variable_list aliases = TiedTableFunction::apply(weight, lookups);
  at::Tensor head = std::move(aliases.back());
  aliases.pop_back();
  return {std::move(aliases), std::move(head)};
}

at::Tensor sparse_lookup(const at::Tensor& table, const at::Tensor& ids) {
  return at::embedding(table, ids, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false, /*sparse=*/true);
}

at::Tensor tied_projection(const at::Tensor& x, const at::Tensor& table, const at::Tensor& bias) {
  return TiedProjection::apply(x, table, optional_input(bias));
}

}  // namespace shardtrain::models
