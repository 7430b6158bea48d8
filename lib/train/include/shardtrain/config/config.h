// The configuration of `shardtrain train`: one typed tree, mirrored 1:1 by YAML sections and command-line overrides.
//
//   model:                          --model.flavor=flava-350m
//     flavor: flava-debug           --parallel.layer_classes=[FlavaLayer]
//   parallel:                       --optim.betas=[0.9,0.98]
//     strategy: full_shard
//
// Every key has a default (Config{} is a valid config), so a file names only what it changes. An unknown key is an
// error naming the key path and the closest valid key; a bad value names the value and what was expected.
//
// The keys of an Accelerate config file (`accelerate config` output: distributed_type, mixed_precision,
// num_processes, fsdp_config.fsdp_sharding_strategy, ...) are accepted in the same file and mapped onto this tree
// (lib/train/src/config/accelerate_keys.cpp has the mapping), so existing Accelerate configs carry over.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardtrain/models/lora_spec.h"
#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/pp/schedule.h"

namespace shardtrain::config {

// What was wrong and where ("config.yaml:12: parallel.strategy: ..."). Derives from invalid_argument: bad input.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

enum class Prefetch { BACKWARD_PRE, BACKWARD_POST, NONE };
enum class Layout { GIVEN, AUTO };  // parallel.layout
enum class LrSchedule { COSINE, LINEAR, CONSTANT };
enum class OptimizerKind { ADAMW, ANYPRECISION_ADAMW, ADAFACTOR, SGD };
enum class Dtype { FLOAT32, BFLOAT16, FLOAT16 };  // model.dtype, AnyPrecision AdamW's state dtypes
enum class Progress { AUTO, BAR, LINES, NONE };
enum class StateDictType { SHARDED, FULL };
enum class LogLevel { DEBUG, INFO, WARNING, ERROR };
// checkpoint.resume: false | true | auto.
enum class Resume { NEVER, ALWAYS, AUTO };
// train.on_nonfinite: stop | skip | rollback.
enum class NonFinite { STOP, SKIP, ROLLBACK };

struct ModelConfig {
  // A Hugging Face model directory (config.json and model.safetensors or a sharded index) to fine-tune: the family
  // and exact size come from its config.json, the weights from its files. Or a model name ("org/name"), found in
  // the Hugging Face cache as from_pretrained finds it offline (io::resolve_hf_model): replaced by its snapshot's
  // directory when the config is read. Sets flavor (to this path) and, when init_weights is empty, init_weights.
  std::string from;
  std::string flavor = "flava-debug";  // a flavor of the zoo (`shardtrain models`), or a config.json / model dir
  std::string family;                  // optional: when set, must be the flavor's family
  // The flavor's dimensions changed, by the family's names: {layers: 4, dim: 512} (`shardtrain models` lists each
  // family's). A custom size from a named one; with model.from, the directory's config.json is the base, and
  // init_weights loads what the resized model shares with the file (the rest reported, as from_pretrained warns).
  std::map<std::string, double> overrides;
  std::string task;                    // what it trains on, one of its family's tasks; empty: the family's default
  // Optional weights under Hugging Face names to start from (io::WeightFiles: safetensors or pytorch_model.bin, a
  // file, an index or a directory), or a model name in the Hugging Face cache (its snapshot once read).
  std::string init_weights;
  // transformers' from_pretrained flag: a tensor of init_weights whose shape differs from the model's keeps its
  // initialization (and is named at start-up) instead of failing the load — a classifier fine-tuned to other labels.
  bool ignore_mismatched_sizes = false;
  double init_std = 0.02;              // std of the normal initialisation (weights depend on train.seed and names)
  // The parameters' own dtype. bfloat16: pure bf16 training — weights, gradients, collectives and checkpoints in
  // bf16, no float32 masters (pair it with optim.name: anyprecision_adamw and Kahan summation).
  Dtype dtype = Dtype::FLOAT32;
  // LoRA fine-tuning (models/lora.h), by PEFT's LoraConfig names: lora.r > 0 adds rank-r adapters to
  // lora.target_modules (default the query and value projections) and trains only them and lora.modules_to_save.
  models::LoraSpec lora;
};

// Sample mix of FLAVA pretraining: each step's batch kind is drawn with these weights (seeded by step).
struct MixConfig {
  double image_text = 1.0;
  double text = 0.0;
  double image = 0.0;
};

struct DataConfig {
  // Files, directories (every data file inside, sorted) or patterns (data/train-*.parquet). image_text/image:
  // WebDataset tars, or tables as Hugging Face datasets keeps them (.parquet: the Hub's; .arrow: load_dataset's
  // cache, save_to_disk); text: those, .txt (one sample per non-empty line), .jsonl, .tsv or .csv (the fields below).
  std::vector<std::string> image_text;
  std::vector<std::string> text;
  std::vector<std::string> image;
  // Held-out data of the task's evaluation: image-text tars for FLAVA (retrieval R@1, ITM accuracy), labelled
  // records for classify (accuracy, F1).
  std::vector<std::string> eval;
  // The tokenizer: a Hugging Face tokenizer.json, a SentencePiece .model, a WordPiece vocab.txt (`shardtrain data
  // vocab` builds one), or a directory holding one, or a model name in the Hugging Face cache (AutoTokenizer's
  // offline lookup); empty: the model.from directory's own (data::open_tokenizer).
  std::string tokenizer;
  std::string vocab;  // the older name of `tokenizer`, for a vocab.txt; at most one of the two

  // The fields of .jsonl/.tsv/.csv records and .arrow/.parquet columns: the text, or two for a sentence pair
  // ([sentence1, sentence2]), or a tokenized dataset's token ids ([input_ids]: read so by default where a record
  // has no "text"; [input_ids, labels] for seq2seq); for model.task classify the label's field and the classes, by
  // id (a record gives a class name or its id: MRPC's 0/1 with labels [not_equivalent, equivalent]); one name is a
  // regression on the label's numbers (STS-B's scores: labels [score]). For model.task token_classify the words'
  // field and their classes' (run_ner's: [tokens] and ner_tags, the defaults then).
  std::vector<std::string> text_fields = {"text"};
  std::string label_field = "label";
  std::vector<std::string> labels;
  // Each sample's label is a set of the classes (a .jsonl array, a .tsv/.csv field "2,15", a table's
  // List(ClassLabel): go_emotions'): binary
  // cross-entropy on every output (transformers' problem_type multi_label_classification), micro F1. A dataset's
  // List(ClassLabel) label column makes one without it.
  bool multi_label = false;
  // Token classification: every token of a word takes its class (a B- class becomes its I- class after the first
  // token, as run_ner's --label_all_tokens) and is scored; false: the first token only, the others no loss.
  bool label_all_tokens = false;
  // A .parquet/.arrow table's image column (datasets' Image, or binary); when it has none of this name, its one
  // Image column. A table's ClassLabel label column gives the classes when `labels` is empty.
  std::string image_field = "image";
  MixConfig mix;
  int64_t max_text_length = 0;    // tokens incl. [CLS] and [SEP]; 0: the model's maximum
  // A text longer than max_text_length: warn (truncated; how many the run's closing lines count) or error (the run
  // stops naming the file and line).
  std::string truncation = "warn";
  // Each batch's texts padded to max_text_length (max_length) or only to the longest of the batch (longest:
  // transformers' DataCollatorWithPadding, run_ner's default): the same losses to float rounding, less work on
  // short texts. Each rank cuts its own batch.
  std::string padding = "max_length";
  // causal_lm: every text whole, end to end, cut into rows of max_text_length, the rows shuffled (transformers'
  // run_clm grouping; data::PackedTexts) instead of one padded row per text, cut to max_text_length.
  bool packing = false;
  // packing: the tokenizer's end of text (eos_token) after every document, so that a row says where one ends
  // (torchtitan's and Megatron's streams; run_clm's GPT-2 stream has none).
  bool packing_eos = false;
  // Where packing keeps the counted token stream for every later start over the same texts and tokenizer (a
  // restart, another run; the node's ranks count it once), and where Parquet files get the Arrow copies a shuffled
  // loader reads (made once per file, as datasets converts them; `shardtrain data cache` lists both): "" the
  // default, $SHARDTRAIN_CACHE or else $XDG_CACHE_HOME/shardtrain or ~/.cache/shardtrain (as Hugging Face datasets'
  // cache); "none": streams counted at every start by every rank, Parquet read in place.
  std::string cache_dir;
  int64_t image_size = 0;         // pixels; 0: the model's
  double mlm_probability = 0.15;  // BERT masking: of the chosen, 80% [MASK], 10% random, 10% kept
  double mim_probability = 0.4;   // fraction of patches masked (BEiT block-wise masking)
  double itm_negative_probability = 0.5;  // image-text pairs whose text is replaced by another pair's (ITM)
  bool lowercase = true;                  // BertTokenizer's do_lower_case (also strips accents)
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};  // FlavaImageProcessor's defaults
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};
  int64_t max_image_pixels = 89478485;  // width x height above which an image is skipped undecoded
                                        // (Pillow's; data::kDefaultMaxImagePixels, checked equal in config_test)
  int64_t workers = 2;      // background loading threads per rank
  int64_t queue_depth = 4;  // batches decoded ahead per rank
};

struct ParallelConfig {
  // given: the keys below as they are. auto (YAML's `parallel: auto` too): the planner's recommended layout for the
  // job's ranks and memory budget at the config's precision (train::plan_run; `shardtrain plan` ranks the same) —
  // strategy, wrap, activation checkpointing, offload, tp_size, sequence_parallel, pp_size and its schedule, and
  // the batch: the global batch (batch_size x grad_accum x ranks) kept, split into micro-batches and accumulation,
  // or with batch_size auto the largest that fits. Those keys are then the planner's to set: given too, refused.
  Layout layout = Layout::GIVEN;
  parallel::Strategy strategy = parallel::Strategy::FULL_SHARD;
  parallel::Precision mixed_precision = parallel::Precision::NO;
  parallel::Wrap wrap = parallel::Wrap::TRANSFORMER;
  std::vector<std::string> layer_classes;  // TRANSFORMER: wrapped classes; empty = the family's layer
  int64_t min_params = 100000000;          // SIZE: a unit closes at this many parameters
  int64_t forward_prefetch = 0;            // units gathered ahead in forward
  Prefetch backward_prefetch = Prefetch::BACKWARD_PRE;
  bool limit_all_gathers = true;
  bool activation_checkpointing = false;  // every transformer layer of layer_classes replays its forward in backward
  // With activation_checkpointing: only every k-th layer (the k-th, 2k-th, ...; 1: all of them), the others keep
  // their activations — torchtitan's selective checkpointing by layer.
  int64_t activation_checkpointing_every = 1;
  // Where an FSDP strategy keeps the model's state (parallel::Offload): none, cpu (the shards, their gradients and
  // the optimizer's state in host memory), nvme (that with AdamW's state on a local disk under nvme_path). The key
  // parallel.cpu_offload (FSDP's name, Accelerate's fsdp_offload_params) says cpu.
  parallel::Offload offload = parallel::Offload::NONE;
  std::string nvme_path;  // offload: nvme: an existing directory on a local disk (a scratch file per rank there)
  // What each transformer layer of layer_classes saves for backward (with activation_checkpointing: its input) in
  // host memory from its forward to its backward, brought back one layer ahead (nn/activation_offload.h); the CPU's
  // host tier on a CPU. Every strategy, DDP included.
  bool activation_offload = false;
  // false: parameters stay unsharded from one micro-batch's backward to the next's forward during gradient
  // accumulation (fewer all-gathers, the whole model's parameters held meanwhile; FSDP2's set_reshard_after_backward)
  bool reshard_after_backward = true;
  bool sync_module_states = true;  // init_weights: rank 0 reads, the others receive (else every rank reads)
  double bucket_cap_mb = 25.0;     // ddp: MiB of gradients per all-reduce bucket
  bool gradient_as_bucket_view = false;  // ddp: gradients live in the buckets (one gradient-sized buffer less)
  // Tensor parallelism (models/tensor_parallel.h): each layer split over tp_size ranks that read the same batches,
  // the innermost dimension of the mesh (ranks of one node); the strategy shards or replicates over the rest.
  // With sequence_parallel, the activations between the split regions are sharded on the sequence dimension too.
  int64_t tp_size = 1;
  bool sequence_parallel = false;
  // Pipeline parallelism (pp/schedule.h): the model's layers in pp_size x pp_stages_per_rank stages over pp_size
  // ranks, each data-parallel rank's batch in pp_microbatches (0: pp_size of them) run by pp_schedule. The schedule
  // prints with `shardtrain train --print-schedule`. The stages are balanced by FLOPs (plan::pipeline_stages), each an
  // FSDP root over its data-parallel ranks; Llama's family with a head of its own, causal_lm.
  int64_t pp_size = 1;
  parallel::PipelineSchedule pp_schedule = parallel::PipelineSchedule::ONE_F_ONE_B;
  int64_t pp_microbatches = 0;
  int64_t pp_stages_per_rank = 1;
  // Where the stages begin: the first layer of each stage after the first, increasing (torchtitan's
  // pipeline_parallel_split_points, as layer indices: [4, 8] cuts 12 layers in three). Empty: balanced by FLOPs.
  std::vector<int64_t> pp_split_points;
  // The data-parallel dimensions (Accelerate's ParallelismConfig): dp_replicate_size x dp_shard_size x tp_size is
  // the world size. 0: inferred — replicate over the nodes under a hybrid strategy (1 otherwise), shard over what
  // is left.
  int64_t dp_replicate_size = 0;
  int64_t dp_shard_size = 0;
  // Seconds before the rendezvous or a collective gives up on a peer. A rank that stops altogether is named
  // sooner, by the heartbeat: after a quarter of this (dist::heartbeat_options_for).
  double timeout = 600;
  // Every this many steps, ranks that hold the same parameters (DDP's data-parallel ranks; the replicas of
  // hybrid_shard and no_shard; a tensor-parallel group, those it does not split) compare a hash of each
  // (dist::compare_replicas); one that differs stops the run, naming the ranks and the tensor. 0: never.
  int64_t check_replicas_every = 0;
};

struct OptimConfig {
  // adamw | anyprecision_adamw (optim::AnyPrecisionAdamW) | adafactor (optim::Adafactor, transformers' Adafactor)
  // | sgd (LibTorch's: momentum, nesterov, L2 weight decay)
  OptimizerKind name = OptimizerKind::ADAMW;
  double lr = 1e-3;
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.01;
  bool no_decay_1d = true;            // biases, norm weights and scalars get no weight decay
  std::vector<std::string> no_decay;  // and parameters whose name matches one of these regular expressions
  LrSchedule schedule = LrSchedule::COSINE;
  int64_t warmup_steps = 100;  // linear from 0 to lr
  double min_lr_ratio = 0.1;   // the schedule ends at lr * min_lr_ratio
  // The step as one fused kernel per device and dtype (optim::FusedAdamW) instead of LibTorch's per-tensor loop,
  // the same results to float32 rounding; for anyprecision_adamw one pass over all CPU float32/bf16 parameters,
  // rounding each tensor once per step instead of after every operation.
  bool fused = true;
  // anyprecision_adamw: the moments' dtypes, and Kahan summation with a compensation buffer of its own dtype.
  bool use_kahan_summation = false;
  Dtype momentum_dtype = Dtype::BFLOAT16;
  Dtype variance_dtype = Dtype::BFLOAT16;
  Dtype compensation_buffer_dtype = Dtype::BFLOAT16;
  // sgd: the momentum (0: plain SGD, no state) and Nesterov's variant of it.
  double momentum = 0.9;
  bool nesterov = false;
  // adafactor, as Hugging Face's Trainer sets it up by default (relative_step and scale_parameter off: optim.lr and
  // the schedule give the learning rate); relative_step: transformers' own default, min(1e-2, 1/sqrt(step)) times,
  // with scale_parameter, the parameter's RMS; optim.lr and the schedule then go unused.
  bool relative_step = false;
  bool scale_parameter = false;
  bool warmup_init = false;        // relative step min(1e-6 step, 1/sqrt(step)); needs relative_step
  double clip_threshold = 1.0;     // the update's RMS is clipped to this
  double decay_rate = -0.8;        // second-moment decay 1 - step^decay_rate
  double beta1 = 0.0;              // first moment (0: none kept, transformers' beta1=None)
  std::vector<double> adafactor_eps = {1e-30, 1e-3};  // added to squared gradients; the least parameter scale
};

inline constexpr int64_t kAutoBatch = 0;  // train.batch_size: auto

struct TrainConfig {
  int64_t steps = 1000;       // optimizer steps
  int64_t batch_size = 8;     // samples per rank per micro-batch; kAutoBatch ("auto"): the largest the memory model
                              // predicts to fit memory_budget (train::plan_run)
  int64_t memory_budget = 0;  // bytes per rank, for batch_size auto ("30GiB" in YAML); 0: memory_limit, else the
                              // GPU's memory, or on CPU half of the machine's RAM shared by its ranks
  // A hard limit in bytes per rank ("40GiB" in YAML; 0: none): tensors beyond it fail with out-of-memory as on a
  // full GPU. On CUDA the caching allocator's cap (torch.cuda.set_per_process_memory_fraction); on CPU the counting
  // allocator refuses allocations above it — a smaller device rehearsed on a larger one.
  int64_t memory_limit = 0;
  int64_t grad_accum = 1;     // micro-batches per optimizer step
  // Reduce gradients after every micro-batch, not only the last (Accelerate's sync_each_batch): with FSDP each
  // rank then accumulates sharded gradients instead of keeping every unit's full gradients until the last
  // micro-batch — less memory, one reduce-scatter per micro-batch.
  bool sync_each_batch = false;
  double max_grad_norm = 1.0; // 0: no clipping
  int64_t seed = 0;           // weights, data order, masking, dropout
  // auto: cuda when a GPU is visible, else cpu (said at start); cuda: each rank takes cuda:LOCAL_RANK.
  parallel::Device device = parallel::Device::AUTO;
  std::string task;           // another name for model.task (where a Trainer user looks for it); both: the same
  // CUDA: float32 matmuls and convolutions in TensorFloat-32 (as the FLAVA post trains); no meaning on CPU.
  bool tf32 = true;
  // Float8 training (parallel::Float8Recipe; models/float8.h): the transformer layers' projections compute their GEMMs
  // in float8 with this recipe's dynamic scaling (torchao's tensorwise or rowwise); none (unset): every GEMM in the
  // activations' dtype. fp8_exclude: module names, or their prefixes, kept in high precision ("layers.0").
  std::optional<parallel::Float8Recipe> fp8;
  std::vector<std::string> fp8_exclude;
  // FSDP's float8 all-gather (fsdp::FsdpOptions::float8_all_gather): the float8 projections' weights gathered in
  // e4m3, half bf16's bytes; tensorwise under a strategy that shards only.
  bool fp8_all_gather = false;
  int64_t stop_at = 0;        // end this run after this step, with a checkpoint (a time-limited job that resumes
                              // later); 0: run to `steps`. The schedule still spans `steps`.
  int64_t eval_interval = 0;  // steps between evaluations on data.eval; 0: at the end only
  int64_t eval_samples = 0;   // 0: the whole eval set
  // A step whose loss (on any rank) or gradient norm is NaN or Inf never reaches the optimizer, on any rank:
  //   stop: the run ends naming the step and the ranks;
  //   skip: the step's update is dropped (its batches consumed); more than max_skipped_steps skipped within
  //         skip_window steps roll back as below;
  //   rollback: the newest verified checkpoint of the run is loaded and the data since it skipped (the batches
  //             that diverged are not trained on again); after max_rollbacks rollbacks, or with no checkpoint to
  //             go back to, the run stops with the history of its skipped steps.
  // No checkpoint is saved after a non-finite step. float16's overflowing gradients are the loss scaler's to skip.
  NonFinite on_nonfinite = NonFinite::SKIP;
  int64_t max_skipped_steps = 5;
  int64_t skip_window = 100;
  int64_t max_rollbacks = 2;
  // Start an explicit batch_size whose predicted peak is above the memory budget (refused before workers start).
  bool force = false;
};

struct CheckpointConfig {
  std::string dir;            // empty: no checkpoints
  int64_t interval = 0;       // steps between checkpoints; 0: at the end only
  int64_t keep = 3;           // the newest K are kept; 0: all
  // true (ALWAYS): continue from the newest checkpoint in dir that verifies (an error when there is none); auto:
  // the same when there is one, else start afresh (what a restarted job wants); false: start afresh. A worker
  // group the launcher restarted (launch.max_restarts) resumes as with auto, from its own run's checkpoints.
  Resume resume = Resume::NEVER;
  // A run that starts afresh needs a dir without checkpoints (they are another run's: a later resume would
  // continue them); overwrite removes them at start instead.
  bool overwrite = false;
  StateDictType state_dict_type = StateDictType::SHARDED;  // FULL also writes model.safetensors (HF names)
  // true: the step blocks only while each rank copies its share into a host staging buffer (kept between saves);
  // a thread writes the files meanwhile, one save at a time (ckpt/async_save.h). A write that fails stops the run
  // at the next save or at its end.
  bool async = false;
  // Settings that change what a resumed run trains (optim.*, train.seed, batch_size, grad_accum, steps, the data)
  // and that differ from the checkpoint's: resume refuses them unless listed here, by key ("optim.lr"), section
  // ("optim") or "all"; allowed ones are logged. The model and its shape can never change (train::check_resume).
  std::vector<std::string> allow_changes;
};

struct LogConfig {
  int64_t interval = 10;      // steps between log lines
  std::string dir;            // TensorBoard events and metrics.csv; empty: none
  bool tensorboard = true;
  bool csv = true;
  Progress progress = Progress::AUTO;  // AUTO: a bar on a terminal, lines otherwise
  double peak_tflops = 0;              // per rank, for MFU; 0: measured with a matmul at start
  int64_t warmup_steps = 2;            // steps left out of items/s and TFLOP/s
  LogLevel level = LogLevel::INFO;     // console lines below it are not printed
};

// Used when `shardtrain train` starts the workers itself (launch.num_processes > 1 and no launcher around it).
struct LaunchConfig {
  int64_t num_processes = 1;  // over all machines (Accelerate's meaning)
  int64_t num_machines = 1;
  int64_t machine_rank = 0;
  std::string main_process_ip;
  int64_t main_process_port = 0;
  std::string rdzv_id;          // the job's id, the same on every machine (needed with num_machines > 1 outside Slurm)
  std::string gpu_ids = "all";  // the GPUs the workers see (CUDA_VISIBLE_DEVICES), "0,1"; Accelerate's gpu_ids
  int64_t max_restarts = 0;     // restarts of the whole worker group after a failure; each resumes (checkpoint.resume)
  double preempt_grace = 30;    // seconds the workers get to save after SIGTERM/SIGINT, then SIGKILL (Slurm's
                                // KillWait is 30 s by default)
};

struct Config {
  ModelConfig model;
  DataConfig data;
  ParallelConfig parallel;
  OptimConfig optim;
  TrainConfig train;
  CheckpointConfig checkpoint;
  LogConfig log;
  LaunchConfig launch;
  // Keys read that change nothing here (Accelerate's dynamo_config, DeepSpeed's tuning knobs), each "where: key: no
  // effect here (why)"; the start of a run says them. Not a key itself: to_yaml does not write it.
  std::vector<std::string> unused_keys;
};

// Reads `path` (YAML), then applies `overrides` ("--section.key=value" or "section.key=value"; values in YAML
// syntax: --optim.betas=[0.9,0.95]). Throws ConfigError.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The pipeline schedule the config's parallel.pp_* keys describe (microbatches: pp_microbatches, or pp_size).
pp::ScheduleShape pipeline_shape(const Config& config);
// The same from YAML text; `source` names it in errors.
Config parse_config(const std::string& yaml, const std::string& source, const std::vector<std::string>& overrides = {});

// The LoRA of an adapter directory PEFT's save_pretrained (or `shardtrain checkpoint export --peft`) wrote, from its
// adapter_config.json, as model.lora.from reads it (`from` set to `dir`); `source` names it in errors. Throws
// ConfigError for a missing file or a LoRA shardtrain does not run (DoRA, rsLoRA, trained biases, ...).
models::LoraSpec read_peft_adapter(const std::string& dir, const std::string& source);

// Applies overrides to `config` without validate() (for building a config one answer at a time).
void apply_overrides(Config& config, const std::vector<std::string>& overrides);

// Checks values against each other (batch sizes, betas, probabilities, ...). load/parse_config call it.
void validate(const Config& config);

// The whole tree as YAML, every key with its value, numbers in the shortest form that reads back the same (0.9);
// `annotated`: each enumeration's values in a comment beside it ("name: adamw  # adamw | anyprecision_adamw |
// adafactor | sgd"), as `shardtrain config --default` writes it. parse_config reads either back to an equal tree.
std::string to_yaml(const Config& config, bool annotated = false);

// Every key path ("train.steps", ...), in tree order.
std::vector<std::string> key_paths();

// Names of enum values as written in YAML ("full_shard").
std::string to_string(OptimizerKind k);

// A key whose value differs between two configs: its path and both values as YAML ("0.001", "[a, b]").
struct KeyChange {
  std::string path;
  std::string before, after;  // before: "(absent)" when the earlier config lacks the key and `after` is no default
};

// The keys whose values differ between `before_yaml` (a config as to_yaml wrote it, perhaps by an older shardtrain:
// a key it lacks counts as its default) and `after`, in tree order. Throws ConfigError when `before_yaml` does not
// read as YAML.
std::vector<KeyChange> changed_keys(const std::string& before_yaml, const Config& after);

}  // namespace shardtrain::config
