#include "plan/step_phases.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <string>

#include "shardtrain/memory/memory_size.h"

namespace shardtrain::plan {

using memory::readable_size;

Moment largest(std::initializer_list<Moment> moments) {
  const Moment* best = nullptr;
  for (const Moment& m : moments) {
    if (best == nullptr || m.bytes > best->bytes) best = &m;
  }
  return best == nullptr ? Moment{} : *best;
}

namespace {

std::string describe_activations(const models::ActivationBytes& a, bool checkpointed) {
  int64_t sum = 0, most = 0;
  for (const models::LayerActivations& layer : a.layers) {
    const int64_t bytes = checkpointed ? layer.input : layer.kept;
    sum += bytes, most = std::max(most, bytes);
  }
  const int64_t count = static_cast<int64_t>(a.layers.size()), mean = count > 0 ? sum / count : 0;
  return std::to_string(count) + " layers x " + readable_size(mean) + (most > mean ? " on average" : "") +
         (checkpointed ? " (checkpointed: inputs only)" : "") + " + " + readable_size(a.kept_outside(checkpointed)) +
         " outside them";
}

std::string activations_note(const StepLayout& s) {
  if (s.offload_activations) {
    return readable_size(s.outside) + " outside the layers; the layers' " + readable_size(s.offloaded_activations) +
           " in host memory (activation offload" + (s.checkpointing ? ", checkpointed: inputs only)" : ")");
  }
  return describe_activations(s.act, s.checkpointing);
}

const char* const kStartNote = "what the model computes first (FLAVA: the codebook making MIM targets)";

}  // namespace

// Gathering a unit holds it twice for a moment: the all-gather's flat output and the parameters copied out of it.
// The root first; then, before any layer, what the model computes first (FLAVA: its extra unit, the codebook,
// gathered and tokenizing). (Autocast gathers nothing: its copies are made as the ops run, none yet.)
Moment forward_start(const StepLayout& s) {
  const int64_t transient = s.act.start_transient;
  if (s.autocast) return {s.base + transient, {{"start of forward", transient, kStartNote}}};
  const int64_t root_twice = 2 * s.root_g, input_twice = s.root_g + 2 * s.in_g, extra_twice = s.root_g + 2 * s.extra_g;
  const int64_t computing = s.root_g + s.extra_g + transient;
  const int64_t top = std::max({root_twice, extra_twice, computing, input_twice});
  Moment m{s.base + top, {}};
  if (top == root_twice) {
    m.terms.push_back({"gathered parameters", top, "the root unit, being gathered (held twice)"});
  } else if (top == input_twice) {
    m.terms.push_back({"gathered parameters", top, "the root unit, and the input edge unit (the embedding) being "
                                                   "gathered (held twice)"});
  } else if (top == extra_twice) {
    m.terms.push_back({"gathered parameters", top, "the root unit, and the extra units being gathered (held twice)"});
  } else {
    m.terms.push_back({"gathered parameters", s.root_g + s.extra_g, "the root unit and the extra units"});
    m.terms.push_back({"start of forward", transient, kStartNote});
  }
  return m;
}

// The layers computing, before the loss keeps anything. A layer gathers as it starts (held twice for a moment: the
// all-gather's output and the parameters copied out of it) and reshards as it ends; with forward prefetch the next
// is gathered while it computes (limit_all_gathers: one ahead at most). The last layer's two moments: being
// gathered, every layer before it kept; computing, its own kept too and its temporaries — checkpointed, every one
// (nothing is kept), else those backward does not need.
Moment forward_layers(const StepLayout& s) {
  const int64_t ahead = s.job->forward_prefetch > 0 ? 1 : 0;
  const int64_t activations = s.kept - s.act.loss_kept;
  // Offloaded, what a layer keeps lives on the device only while it computes: all of it is a temporary then.
  const bool transient = s.checkpointed > 0 || s.offload_activations;
  const int64_t work = std::max(transient ? s.act.layer_forward_transient : 0, s.act.layer_forward_unkept);
  // Offloaded, the bias every layer reads left the device with the layer that keeps it, but the model holds it
  // through forward to hand it to the next layer (unless it is counted outside the layers already).
  const int64_t bias = s.offload_activations && s.outside == s.act.outside_layers ? s.act.layer_bias : 0;
  const int64_t gathered = s.reshard ? s.root_g + (1 + ahead) * s.layer_g : s.all_g - s.out_g;
  const int64_t last_kept = s.layer_kept.empty() || s.offload_activations ? 0 : s.layer_kept.back();
  const int64_t gathering = s.root_g + (2 + ahead) * s.layer_g;
  if (s.reshard && gathering - last_kept > gathered + work) {
    Moment m{s.base + gathering + activations - last_kept + bias, {}};
    m.terms.push_back({"gathered parameters", gathering, "the root unit and the last layer being gathered (held "
                                                         "twice)"});
    m.terms.push_back({"activations", activations - last_kept + bias, "of the layers before the last"});
    return m;
  }
  Moment m{s.base + gathered + activations + bias + work, {}};
  m.terms.push_back({"gathered parameters", gathered,
                     !s.gathers   ? "none: a group of one holds its parameters"
                     : !s.reshard ? "every unit, gathered until its backward"
                     : ahead > 0  ? "the root unit and a layer with the next prefetched"
                                  : "the root unit and the layer computing"});
  m.terms.push_back({"activations", activations + bias,
                     activations_note(s) + ", less the loss's" + (bias > 0 ? ", the bias every layer reads" : "")});
  if (work > 0) m.terms.push_back({"layer temporaries", work, "a layer computing (attention, MLP)"});
  return m;
}

// The end of forward: what stays gathered for the loss and the backward that follows, every activation kept, the
// loss's logits on top.
Moment forward_loss(const StepLayout& s) {
  Moment m{s.base + s.held_g + s.kept + s.act.loss_transient, {}};
  m.terms.push_back({"gathered parameters", s.held_g,
                     !s.gathers    ? "none: a group of one holds its parameters"
                     : !s.reshard  ? "every unit, gathered until its backward"
                     : s.out_g > 0 ? "the root unit and the head's"
                                   : "the root unit (embeddings, heads)"});
  m.terms.push_back({"activations", s.kept, activations_note(s)});
  m.terms.push_back({"end of forward", s.act.loss_transient, "the loss's logits and their copies"});
  return m;
}

// Backward starts with the root still gathered from its forward (the root is never resharded between its forward
// and the backward that follows), the loss's gradients arriving with the last layer prefetched. An output edge unit
// resharded after the loss is gathered again as backward starts, and held twice for a moment (the all-gather's
// output and the parameters copied out of it) before the last layer's prefetch is issued.
Moment backward_start(const StepLayout& s) {
  const int64_t prefetched = s.reshard ? s.layer_g : 0, regather = s.reshard ? s.out_g : 0;
  const int64_t gathered = s.held_g + std::max(prefetched, regather);
  Moment m{s.base + s.kept + gathered + s.act.backward_transient, {}};
  m.terms.push_back({"gathered parameters", gathered,
                     !s.gathers              ? "none: a group of one holds its parameters"
                     : !s.reshard            ? "every unit, gathered since forward"
                     : regather > prefetched ? "the root unit, and the head's being gathered again (held twice)"
                                             : "the root unit (and the head's), and the last layer prefetched"});
  m.terms.push_back({"activations", s.kept, activations_note(s)});
  m.terms.push_back({"loss gradients", s.act.backward_transient, "log-softmax's result's gradient and the logits'"});
  return m;
}

// An output edge unit reduces its gradients first (the head's, which the loss keeps from forward): resharded, its
// gradients copied into the reduction's input, then the reduction while the activations below wait.
Moment head_reduction(const StepLayout& s) {
  if (!s.reduces || s.units.output_trainable == 0) return {s.base, {}};
  const int64_t head = s.units.output_trainable;
  const int64_t others = s.reshard ? s.root_g + s.layer_g : s.all_g - s.out_g;  // gathered meanwhile
  const int64_t top = std::max(others + s.kept + head * s.rd, others + s.kept - s.act.loss_kept + s.reduce_scatter(head));
  Moment m{s.base + top, {}};
  m.terms.push_back({"gathered parameters", others,
                     s.reshard ? "the root unit, and the last layer prefetched" : "every unit but the head's"});
  m.terms.push_back({"head reduce-scatter", top - others - s.kept + s.act.loss_kept,
                     "the head's gradients and flat input, or its reduction (flat input, output shard, Gloo's "
                     "receive buffers)"});
  m.terms.push_back({"activations", s.kept - s.act.loss_kept, activations_note(s) + ", less the loss's"});
  return m;
}

namespace {

// Layer i (1 = the last) computing its backward: the layers below it still keep their activations, those above
// have handed in their gradients. The walk keeps the largest moment's parts; its terms are written once, at the end.
class LayerWalk {
 public:
  explicit LayerWalk(const StepLayout& s)
      : s_(s), layers_(static_cast<int64_t>(s.act.layers.size())), below_kept_(s.offload_activations ? 0 : s.kept_by_layers) {
    const parallel::Wrap wrap = s.job->wrap;
    own_units_ = wrap != parallel::Wrap::NONE && s.layer_units == s.act.layers.size();
    pairs_ = wrap != parallel::Wrap::NONE;  // (one unit for the whole model: gathered, its gradients growing)
  }

  Walk run() {
    for (int64_t i = 1; i <= layers_; ++i) {
      const Layer layer = enter(i);
      backward_moments(i, layer);
      if (leave(i, layer)) reduction_moments(i, layer);
    }
    return {terms(), parameters_called_twice_};
  }

 private:
  // What layer i's moments share.
  struct Layer {
    bool runs_again = false, ran_before = false;
    int64_t own_g = 0;             // its gathered parameters
    int64_t next = 0, next_again = 0;  // what is prefetched for the layer below (again: a layer run twice)
    int64_t above_g = 0;           // the parameters of the layers done, gathered before
    int64_t gathered = 0;          // every unit gathered meanwhile
    int64_t waiting_grads = 0;     // the partial gradients of layers run twice, waiting
    int64_t done = 0;              // the gradients made so far, but this layer's
    int64_t root_grads = 0;        // the root's full gradients at this point
    int64_t below = 0;             // what the layers below and the rest keep
  };

  // Layer i of the walk: its own unit's parameters where each layer is one, in registration order (T5's decoder
  // layers, with cross-attention, are a third larger than its encoder's), else the largest.
  int64_t walk_unit(const std::vector<int64_t>& per_unit, int64_t largest, int64_t i) const {
    return own_units_ ? per_unit[static_cast<size_t>(layers_ - std::min(i, layers_))] : largest;
  }
  int64_t walk_numel(int64_t i) const { return walk_unit(s_.units.numel, s_.largest_layer, i); }
  int64_t walk_g(int64_t i) const { return walk_unit(s_.unit_g, s_.layer_g, i); }  // its gathered bytes

  Layer enter(int64_t i) {
    const StepLayout& s = s_;
    const models::LayerActivations& activations = s.act.layers[static_cast<size_t>(layers_ - i)];
    if (!s.offload_activations) below_kept_ -= s.layer_kept[static_cast<size_t>(layers_ - i)];
    Layer l;
    // Offloaded, the layers below are in host memory but the next one down, brought back with this one.
    const int64_t below_on_device = !s.offload_activations ? below_kept_
                                    : i < layers_         ? s.layer_kept[static_cast<size_t>(layers_ - i - 1)]
                                                          : 0;
    l.runs_again = pairs_ && activations.runs_again, l.ran_before = pairs_ && activations.ran_before;
    l.own_g = walk_g(i);
    l.waiting_grads = s.reduces ? waiting_numel_ * s.ce : 0;
    waiting_now_ = l.waiting_grads;
    // Gradients not reduced unit by unit (one rank, DDP) are .grad from the moment they are made: the head's (the
    // root's and an output edge unit's) first, then the layers' done. (One unit for the whole model: they grow
    // layer by layer.) (The root's parameters that compute before the layers, its embeddings', get theirs at the
    // end.)
    const int64_t unreduced_head =
        s.reduces                    ? 0
        : s.job->wrap == parallel::Wrap::NONE ? s.new_grads * (i - 1) / layers_
                                     : (s.root_trainable - s.root_input_side + s.units.output_trainable) * s.pe;
    l.done = grad_shards_ * s.pe + unreduced_head;
    // Without resharding after forward every layer is still gathered until its own backward is done (the output
    // edge unit resharded after its own, the input one gathered to the end), a layer run twice until its second
    // run's: its first run's gathers it again, and the one before prefetches it. The first layer prefetches the
    // input edge unit where there is one.
    l.next = i < layers_ || s.in_g == 0 ? walk_g(i + 1) : s.in_g;
    // Offloaded, a gather copies the unit's shard to the device first (fsdp::foreach_all_gather), the collective
    // holding it until the gathered parameters are taken: the prefetched one's, through this layer's backward.
    if (s.offload && s.reshard && l.next > 0) l.next += ceil_div(l.next, s.shard);
    l.next_again =
        i < layers_ && pairs_ && s.act.layers[static_cast<size_t>(layers_ - i - 1)].runs_again ? l.next : 0;
    l.above_g = above_g_;
    const int64_t waiting_g = waiting_g_;
    l.gathered = s.reshard ? s.root_g + l.own_g + l.next
                           : std::max<int64_t>(s.all_g - s.out_g - l.above_g - waiting_g +
                                                   (l.runs_again ? l.own_g : 0) + l.next_again,
                                               s.root_g + s.in_g);
    // One unit for the whole model: its full gradients grow layer by layer; else the root's (heads) are there first.
    l.root_grads = s.job->wrap == parallel::Wrap::NONE ? s.root_full_grads * (i - 1) / layers_
                                              : s.root_full_grads - (s.reduces ? s.root_input_side * s.ce : 0);
    l.below = below_on_device + s.outside - s.act.loss_kept;
    return l;
  }

  // The layer's backward, moment by moment (walked from the last layer): its MLP's, whose output projection's
  // gradient is made first, then attention's, with all of them. Reduced, they are full gradients in the compute
  // dtype until the layer's reduction; else .grad from the start. A checkpointed layer replays its forward from
  // its kept input (the same tensor: not counted twice).
  void backward_moments(int64_t i, const Layer& l) {
    const StepLayout& s = s_;
    const size_t index = static_cast<size_t>(layers_ - i);
    const models::LayerActivations& activations = s.act.layers[index];
    const int64_t own = s.layer_kept[index];
    const int64_t replay = s.checkpoint[index] ? activations.kept - activations.input : 0;
    static const std::vector<models::BackwardMoment> every_gradient_at_once = {{0, -1}};  // no moments stated
    for (const models::BackwardMoment& moment :
         activations.backward.empty() ? every_gradient_at_once : activations.backward) {
      const int64_t made = moment.gradient_elements < 0 ? walk_numel(i)
                                                        : std::min(moment.gradient_elements, walk_numel(i));
      const int64_t layer_full_grads = (s.reduces ? made * s.ce : 0) + l.waiting_grads;
      const int64_t done_now = l.done + (s.reduces ? 0 : made * s.pe);
      const int64_t grads_so_far = std::min(done_now, s.new_grads);  // those accumulated in place are in the base
      // The reduction in flight is the layer above's: none while the last layer computes. DDP's: the buckets its
      // gradients so far have filled, two at most (a tied table's is ready only at the end, whatever it holds; a
      // unit run twice only once both runs' are in).
      const int64_t unready = waiting_numel_ + (l.ran_before || l.runs_again ? made : 0);
      const int64_t ready =
          std::max<int64_t>(0, done_now - s.shape->tied_tables * s.pe - (s.reduces ? 0 : unready * s.pe));
      const int64_t in_flight = s.ddp_buckets ? ddp_in_flight(s.buckets, ready, s.first_blocked)
                                : i > 1       ? s.comm
                                              : 0;
      candidate(l.gathered + in_flight + layer_full_grads + l.root_grads + l.below + own + replay +
                    moment.transient + grads_so_far + s.tied_held,
                {l.gathered, in_flight, layer_full_grads, l.root_grads, std::max<int64_t>(0, moment.transient)});
    }
  }

  // [Parameters run twice] A layer's second run (LayerActivations::ran_before) is walked first: its unit's
  // gradients wait, partial, in autograd's buffers — no reduction, no DDP bucket — until its first run's backward
  // adds into them and completes them (its AccumulateGrad runs once, then). Meanwhile the unit is resharded, and
  // gathered again for its first run's backward (fully_shard: [Note: a unit called twice]). The units waiting, in
  // the order they complete (the last layer's second run pairs with its first). Returns whether the layer's
  // gradients are complete (and reduced) now.
  bool leave(int64_t i, const Layer& l) {
    if (!l.runs_again) grad_shards_ += ceil_div(walk_numel(i), s_.shard);
    if (l.runs_again) parameters_called_twice_ += walk_numel(i);
    if (l.ran_before) {  // waits for its first run: no reduction yet
      waiting_.push_back({walk_numel(i), walk_g(i)}), waiting_numel_ += walk_numel(i), waiting_g_ += walk_g(i);
      return false;
    }
    if (l.runs_again && !waiting_.empty()) {
      waiting_numel_ -= waiting_.front().first, waiting_g_ -= waiting_.front().second, waiting_.pop_front();
    }
    above_g_ += walk_g(i);
    return true;
  }

  // The layer's reduction: its full gradients copied into the flat input, all of them alive while that is
  // allocated (each is dropped once copied), the layer resharded and the next layer's gather issued. Waited for at
  // once (Gloo), the reduction is a moment of its own: input, output and receive buffers (on the CPU, bf16's
  // float32 sum is the most).
  void reduction_moments(int64_t i, const Layer& l) {
    const StepLayout& s = s_;
    if (!s.reduces || s.job->wrap == parallel::Wrap::NONE) return;
    // The units still waiting for their first runs hold their partial gradients, resharded.
    const int64_t waiting_full = waiting_numel_ * s.ce;
    waiting_now_ = waiting_full;
    const int64_t gathered =
        s.reshard ? s.root_g + l.next
                  : std::max<int64_t>(s.all_g - s.out_g - l.above_g -
                                          (walk_g(i) + waiting_g_) + l.next_again,
                                      s.root_g + s.in_g);
    const int64_t trainable = walk_unit(s.units.trainable, s.largest_layer_trainable, i);
    const int64_t grads_so_far = std::min(l.done, s.new_grads);
    const int64_t rest = gathered + waiting_full + l.root_grads + l.below + grads_so_far + s.tied_held;
    candidate(rest + trainable * s.rd + trainable * s.ce,
              {gathered, trainable * s.rd, trainable * s.ce + waiting_full, l.root_grads, 0});
    if (!s.overlap) {
      candidate(rest + s.reduction(trainable), {gathered, s.reduction(trainable), waiting_full, l.root_grads, 0});
    }
  }

  // The parts of the largest moment so far.
  struct Parts {
    int64_t gathered = 0, in_flight = 0, layer_grads = 0, root_grads = 0, work = 0;
  };
  void candidate(int64_t at, const Parts& parts) {
    if (at <= best_) return;
    best_ = at, best_parts_ = parts, best_waiting_ = waiting_now_;
  }

  Moment terms() const {
    const StepLayout& s = s_;
    const Parts& p = best_parts_;
    Moment m{s.base + best_, {}};
    m.terms.push_back({"gathered parameters", p.gathered,
                       s.reshard ? "the root unit and a layer with the next prefetched"
                                 : "the units whose backward has not run yet"});
    m.terms.push_back({"full gradients and reductions", p.in_flight + p.layer_grads + p.root_grads,
                       (p.layer_grads > 0 ? std::string("a layer's full gradients so far and the root's, a "
                                                        "reduction's input or one in flight")
                                          : std::string("a layer's reduction, the root's full gradients")) +
                           (best_waiting_ > 0 ? "; " + readable_size(best_waiting_) +
                                                    " of them the partial gradients of the layers run twice, "
                                                    "waiting for their other run"
                                              : "")});
    m.terms.push_back({"activations and gradients so far",
                       best_ - p.gathered - p.in_flight - p.layer_grads - p.root_grads - p.work - s.tied_held,
                       std::string(s.offload_activations ? "the layer and the one below it brought back from host "
                                                           "memory"
                                                         : "the layers not yet done") +
                           (s.checkpointing ? ", one layer replayed" : "") +
                           ", the gradients of those done"});
    m.terms.push_back({"layer gradients in flight", p.work,
                       "what a layer's backward holds beside what it kept: the gradients of its output and "
                       "input, the MLP's or attention's temporaries (T5: its stack's position bias's gradient)"});
    if (s.tied_held > 0) {
      m.terms.push_back({"tied table's gradient", s.tied_held, "the head's, waiting for the lookups' rows"});
    }
    return m;
  }

  const StepLayout& s_;
  const int64_t layers_;
  bool own_units_ = false, pairs_ = false;
  int64_t below_kept_ = 0;       // what the layers not done yet keep, this one's included
  int64_t above_g_ = 0;          // the gathered bytes of the layers done (their units complete)
  int64_t grad_shards_ = 0;      // the gradient elements the layers walked have made (a layer run twice: once)
  // The units of layers run twice waiting for their first run, in order: (elements, gathered bytes).
  std::deque<std::pair<int64_t, int64_t>> waiting_;
  int64_t waiting_numel_ = 0, waiting_g_ = 0;
  int64_t waiting_now_ = 0;      // of the layer gradients, the partial ones of layers run twice
  int64_t parameters_called_twice_ = 0;
  int64_t best_ = 0;
  Parts best_parts_;
  int64_t best_waiting_ = 0;
};

}  // namespace

Walk backward_walk(const StepLayout& s) { return LayerWalk(s).run(); }

// The end: the root's gradients complete (a tied table's lookups add their rows into its head's gradient in place:
// tie_table()), with an input edge unit's, which reduces first; then, sharded, the root's reduce-scatter once its
// full parameters are dropped. (Every layer has been resharded after its backward by then: only the root and the
// input unit are gathered.) (With overlap the last layer's reduction is still in flight while the root computes;
// DDP's buckets are all there as the last ones all-reduce.) Each reduction's input is allocated with the unit's
// full gradients still alive, as a layer's; the gradient shards of the units reducing last are not there yet.
Moment backward_end(const StepLayout& s) {
  const std::string per_param = std::to_string(s.pe) + " B per trainable parameter" + s.per_ranks();
  const int64_t input_trainable = s.units.input_trainable;
  const int64_t root_shard_grads = s.new_grads > 0 ? ceil_div(s.root_trainable, s.shard) * s.pe : 0;
  const int64_t in_shard_grads = s.new_grads > 0 ? ceil_div(input_trainable, s.shard) * s.pe : 0;
  auto end_reduction = [&](int64_t trainable, int64_t full_grads) {
    return std::max(full_grads + trainable * s.rd, s.reduction(trainable));
  };

  Moment gradients{s.base + s.root_g + s.in_g + s.new_grads + s.root_full_grads + s.in_full_grads + s.tied_held +
                       s.comm,
                   {}};
  gradients.terms.push_back({"gathered parameters", s.root_g + s.in_g,
                             s.in_g > 0 ? "the root unit and the embedding's" : "the root unit"});
  gradients.terms.push_back({"gradients", s.new_grads + s.root_full_grads + s.in_full_grads + s.tied_held,
                             per_param + (s.reduces ? ", the root's still full" : "") +
                                 (s.tied_held > 0 ? ", the tied table's apart from .grad" : "")});
  if (s.comm > 0) {
    const bool ddp = s.job->strategy == parallel::Strategy::DDP;
    gradients.terms.push_back({ddp ? "buckets" : "reduction in flight", s.comm,
                               ddp ? "DDP's gradient buckets, the last ones all-reducing" : "the last layer's"});
  }

  Moment root{s.base, {}}, input_gather{s.base, {}}, input_reduction{s.base, {}};
  if (s.reduces) {
    const int64_t root_rs = end_reduction(s.root_trainable, s.root_full_grads);
    root.bytes += s.new_grads - root_shard_grads + root_rs;
    root.terms.push_back({"gradients", s.new_grads - root_shard_grads, per_param + ", but the root's"});
    root.terms.push_back({"root reduce-scatter", root_rs,
                          "its full gradients and flat input, or the collective (the flat input, the output shard, "
                          "Gloo's receive buffers)"});
    const int64_t input_rs = end_reduction(input_trainable, s.in_full_grads);
    const int64_t others = s.new_grads - root_shard_grads - in_shard_grads + s.root_full_grads;
    input_reduction.bytes += others + input_rs;
    input_reduction.terms.push_back({"gradients", others, per_param + ", the root's still full, but the embedding's"});
    input_reduction.terms.push_back({"embedding reduce-scatter", input_rs,
                                     "the input edge unit's full gradients and flat input, or the collective"});
  }
  // An input edge unit resharded after its forward is gathered again for its backward (held twice for a moment).
  if (s.reshard) {
    input_gather.bytes += s.root_g + 2 * s.in_g + s.new_grads + s.root_full_grads;
    input_gather.terms.push_back({"gathered parameters", s.root_g + 2 * s.in_g,
                                  "the root unit, and the embedding's being gathered again (held twice)"});
    input_gather.terms.push_back({"gradients", s.new_grads + s.root_full_grads, per_param + ", the root's still full"});
  }
  return largest({gradients, root, input_gather, input_reduction});
}

// The step: clipping sums squares in float64 (FSDP and tensor parallelism: a float64 copy of a gradient and its
// square, the largest shard's; DDP's clip_grad_norm_ takes norms without copies), then AdamW a parameter at a time
// (sqrt(v) and its quotient by the bias correction, two temporaries of the largest tensor). (Per-parameter shards: a
// parameter's rows split over the group, whatever the wrap.) The accumulation is over: the gradients are .grad.
int64_t step_temporaries(const StepLayout& s) {
  const int64_t largest_shard = ceil_div(s.shape->largest_trainable_tensor, s.shard);
  const bool float64_copies = s.job->strategy != parallel::Strategy::DDP || s.job->tp > 1;
  const int64_t clip_temp = float64_copies ? 2 * largest_shard * 8 : 0;
  const int64_t adam_temp = s.job->fused_optimizer ? 0 : 2 * largest_shard * s.pe;
  return std::max(clip_temp, adam_temp);
}

Moment optimizer_step(const StepLayout& s) {
  const int64_t temporaries = s.offload ? 0 : step_temporaries(s);  // offloaded: the host's
  Moment m{s.dev_params + s.dev_adam + s.dev_grads + temporaries, {}};
  m.terms.push_back({"gradients", s.dev_grads,
                     std::to_string(s.pe) + " B per parameter" + s.per_ranks()});
  m.terms.push_back({"clipping and AdamW temporaries", temporaries,
                     "of the largest tensor: float64 copies to clip, or AdamW's sqrt(v) and quotient"});
  return m;
}

}  // namespace shardtrain::plan
