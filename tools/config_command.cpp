// `shardtrain config`: the questions `accelerate config` asks, and those a run needs besides (the model, its task,
// the data, batch, steps, learning rate and where results go), answered into a YAML config that `shardtrain train`
// runs. Each answer is checked as it is given — applied to the config tree (its own errors), a path looked for, a
// flavor looked up — and a bad one is asked again.
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <sstream>

#include "cli_args.h"
#include "commands.h"
#include "shardtrain/config/config.h"
#include "shardtrain/data/pipeline/source.h"
#include "shardtrain/data/pipeline/synth.h"
#include "shardtrain/data/tokenizers/tokenizer.h"
#include "shardtrain/io/files.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/util/ascii_case.h"

namespace shardtrain::cli {
namespace {

// What the answers so far decided beyond the config's keys.
struct Answers {
  config::Config config;
  std::string output;    // the run's directory: checkpoints/, the logs, data/ when synthesized
  bool synth = false;    // the data is written by the questionnaire (its keys are set)
  data::SampleKind kind = data::SampleKind::TEXT;  // the data the task reads (FLAVA's pairs, ViT's images)
  bool evaluates = false;
};

struct Question {
  std::string prompt;
  std::function<std::string(const Answers&)> fallback;    // the answer an empty line gives
  std::function<bool(const Answers&)> applies;            // null: always asked
  std::function<void(Answers&, const std::string&)> set;  // throws std::invalid_argument for a bad answer
};

void apply(Answers& a, const std::string& key, const std::string& value) {
  config::apply_overrides(a.config, {"--" + key + "=" + value});
}

// The comma-separated items of an answer, spaces around them dropped.
std::vector<std::string> items_of(const std::string& answer) {
  std::vector<std::string> items;
  std::stringstream text(answer);
  std::string item;
  while (std::getline(text, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// "a, #b" -> ["a","#b"]: a YAML list of the items, each quoted (a column name may hold YAML's own characters).
std::string as_list(const std::string& answer) {
  std::string list = "[";
  for (const std::string& item : items_of(answer)) {
    std::string quoted = "\"";
    for (char ch : item) quoted += ch == '"' || ch == '\\' ? std::string("\\") + ch : std::string(1, ch);
    list += (list.size() > 1 ? "," : "") + quoted + "\"";
  }
  return list + "]";
}

// y/yes/true, n/no/false, any case.
std::string yes_no(const std::string& answer) {
  const std::string a = util::ascii_lower(answer);
  if (a == "y" || a == "yes" || a == "true") return "true";
  if (a == "n" || a == "no" || a == "false") return "false";
  throw std::invalid_argument("'" + answer + "' is not yes or no (y, n)");
}

Question plain(std::string key, std::string prompt, std::string fallback,
               std::function<bool(const Answers&)> applies = nullptr) {
  return {std::move(prompt), [fallback](const Answers&) { return fallback; }, std::move(applies),
          [key](Answers& a, const std::string& answer) { apply(a, key, answer); }};
}

Question yes_no_question(std::string key, std::string prompt, std::function<bool(const Answers&)> applies = nullptr) {
  return {std::move(prompt), [](const Answers&) { return std::string("no"); }, std::move(applies),
          [key](Answers& a, const std::string& answer) { apply(a, key, yes_no(answer)); }};
}

std::string flavor_list() {
  std::string text, family;
  for (const models::FlavorName& f : models::list_flavors()) {
    if (f.family != family) text += (text.empty() ? "  " : "\n  ") + f.family + ":", family = f.family;
    text += " " + f.flavor;
  }
  return text + "\n  or a Hugging Face model directory (its config.json, weights and tokenizer)";
}

void set_model(Answers& a, const std::string& answer) {
  if (answer == "list" || answer == "?") throw std::invalid_argument("the flavors:\n" + flavor_list());
  const auto recipe = models::recipe_of_model(answer);  // throws naming the closest flavor
  apply(a, io::is_directory(answer) ? "model.from" : "model.flavor", answer);
  a.config.model.task.clear();
}

std::shared_ptr<const models::ModelRecipe> recipe_of(const Answers& a) {
  return models::recipe_of_model(a.config.model.from.empty() ? a.config.model.flavor : a.config.model.from);
}

void set_task(Answers& a, const std::string& answer) {
  const auto recipe = recipe_of(a);
  const auto tasks = recipe->tasks();
  if (std::find(tasks.begin(), tasks.end(), answer) == tasks.end()) {
    std::string listed;
    for (const auto& t : tasks) listed += (listed.empty() ? "" : ", ") + t;
    throw std::invalid_argument("'" + answer + "' is not a task of " + recipe->family() + " (" + listed + ")");
  }
  apply(a, "model.task", answer);
  a.kind = data::SampleKind::TEXT, a.evaluates = true;
  try {
    const auto task = recipe->task(answer);
    a.kind = task->data_needs().largest_kind(), a.evaluates = task->has_evaluation();
  } catch (const std::invalid_argument&) {  // a text task that needs a head the flavor lacks: built with its data
  }
}

std::string tasks_prompt(const Answers& a) {
  std::string listed;
  for (const auto& t : recipe_of(a)->tasks()) listed += (listed.empty() ? "" : ", ") + t;
  return listed;
}

void set_output(Answers& a, const std::string& answer) {
  if (answer.empty()) throw std::invalid_argument("the output directory is needed");
  if (io::path_exists(answer) && !io::is_directory(answer)) {
    throw std::invalid_argument("'" + answer + "' is a file, not a directory");
  }
  a.output = answer;
  apply(a, "checkpoint.dir", answer + "/checkpoints");
  apply(a, "log.dir", answer);
}

// Where the task's data lies in a synthetic set under `d`: the key it goes to, the training and held-out files, and
// the records' text fields (empty: the format's own).
struct SynthLayout {
  std::string key, train, eval, fields;
};

SynthLayout synth_layout(const Answers& a, const std::string& d) {
  const std::string& task = a.config.model.task;
  if (a.kind == data::SampleKind::IMAGE_TEXT) return {"data.image_text", d + "/image_text", d + "/eval", ""};
  if (a.kind == data::SampleKind::IMAGE) return {"data.image", d + "/image", d + "/eval", ""};
  if (task == "classify") {
    return {"data.text", d + "/pairs/train.tsv", d + "/pairs/eval.tsv", "[\"#1 String\",\"#2 String\"]"};
  }
  if (task == "token_classify") return {"data.text", d + "/ner/train.conll", d + "/ner/valid.conll", ""};
  return {"data.text", d + "/seq2seq/train.jsonl", d + "/seq2seq/eval.jsonl",
          task == "seq2seq" ? "[input,target]" : "[input]"};
}

// The synthetic set (`shardtrain data synth`: captioned scenes of shapes) under <output>/data, and the keys that
// point the task at it: FLAVA its image-text shards, ViT its images (labelled by shape), a classifier sentence
// pairs, a tagger CoNLL sentences, seq2seq (input, target) records, other text tasks the records' inputs.
void write_synth(Answers& a) {
  data::SynthOptions o;
  o.out = a.output + "/data";
  const bool text = a.kind == data::SampleKind::TEXT;
  o.image_text_samples = a.kind == data::SampleKind::IMAGE_TEXT ? 2000 : 0;
  o.image_samples = a.kind == data::SampleKind::IMAGE ? 2000 : 0;
  o.eval_samples = text ? 0 : 256;
  o.text_samples = 0;
  o.pair_samples = o.seq2seq_samples = o.ner_samples = text ? 2000 : 0;
  const int64_t files = data::write_synth_dataset(o);
  std::cout << "  data synth: wrote " << files << " files to " << o.out << "\n";
  const SynthLayout layout = synth_layout(a, o.out);
  apply(a, layout.key, "[" + layout.train + "]");
  if (a.evaluates) apply(a, "data.eval", "[" + layout.eval + "]");
  if (!layout.fields.empty()) apply(a, "data.text_fields", layout.fields);
  if (a.config.model.task == "classify" && text) {
    apply(a, "data.label_field", "Quality");
    apply(a, "data.labels", "[not_equivalent,equivalent]");
  }
  if (a.config.model.task == "token_classify") apply(a, "data.labels", "[O,B-OBJ,I-OBJ,B-LOC,I-LOC]");
  if (a.kind != data::SampleKind::IMAGE &&
      (a.config.model.from.empty() || data::tokenizer_file(a.config.model.from).empty())) {
    apply(a, "data.vocab", o.out + "/vocab.txt");
  }
  if (text) apply(a, "data.max_text_length", "48");
}

// Paths that must be there now, as a YAML list: a missing one is named.
std::string existing_paths(const std::string& answer) {
  const std::vector<std::string> paths = items_of(answer);
  if (paths.empty()) throw std::invalid_argument("no path given");
  for (const std::string& path : paths) {
    if (!io::path_exists(path)) throw std::invalid_argument("'" + path + "' does not exist");
  }
  return as_list(answer);
}

void set_data(Answers& a, const std::string& answer) {
  if (util::ascii_lower(answer) == "synth") {
    a.synth = true;
    write_synth(a);
    return;
  }
  a.synth = false;
  apply(a, std::string("data.") + data::kind_name(a.kind), existing_paths(answer));
}

bool needs_tokenizer(const Answers& a) {
  return !a.synth && a.kind != data::SampleKind::IMAGE &&
         (a.config.model.from.empty() || data::tokenizer_file(a.config.model.from).empty());
}

void set_tokenizer(Answers& a, const std::string& answer) {
  existing_paths(answer);
  const bool vocab_txt = answer.size() > 4 && answer.substr(answer.size() - 4) == ".txt";
  apply(a, vocab_txt ? "data.vocab" : "data.tokenizer", answer);
}

const std::vector<Question>& questions() {
  const auto text_data = [](const Answers& a) { return !a.synth && a.kind == data::SampleKind::TEXT; };
  const auto labelled = [](const Answers& a) {
    const std::string& t = a.config.model.task;
    return !a.synth && (t == "classify" || t == "token_classify" || t == "image_classification");
  };
  const auto sharded = [](const Answers& a) { return a.config.parallel.strategy != parallel::Strategy::DDP; };
  const auto several_machines = [](const Answers& a) { return a.config.launch.num_machines > 1; };
  static const std::vector<Question> q = {
      {"Which model? A flavor of the zoo (`list` lists them) or a Hugging Face model directory",
       [](const Answers&) { return std::string("flava-debug"); }, nullptr, set_model},
      {"What does it train on ({tasks})?",
       [](const Answers& a) { return recipe_of(a)->tasks().front(); }, nullptr, set_task},
      {"Output directory (checkpoints, metrics.csv, TensorBoard events)",
       [](const Answers& a) {
         std::string name = a.config.model.from.empty() ? a.config.model.flavor : a.config.model.from;
         name = name.substr(name.find_last_of('/') + 1);
         return "runs/" + (name.empty() ? std::string("run") : name);
       },
       nullptr, set_output},
      {"Training data: files or directories, comma-separated, or `synth` to write a synthetic set now",
       [](const Answers&) { return std::string("synth"); }, nullptr, set_data},
      {"Held-out data for evaluation, comma-separated (`none`: no evaluation)",
       [](const Answers&) { return std::string("none"); },
       [](const Answers& a) { return !a.synth && a.evaluates; },
       [](Answers& a, const std::string& answer) {
         if (util::ascii_lower(answer) != "none") apply(a, "data.eval", existing_paths(answer));
       }},
      {"Tokenizer: a tokenizer.json or a vocab.txt (`shardtrain data vocab` learns one)",
       [](const Answers&) { return std::string(); }, needs_tokenizer, set_tokenizer},
      {"Fields or columns holding the text, comma-separated (`shardtrain data show FILE` lists a table's)",
       [](const Answers&) { return std::string("text"); }, text_data,
       [](Answers& a, const std::string& answer) { apply(a, "data.text_fields", as_list(answer)); }},
      {"Field or column holding the label", [](const Answers&) { return std::string("label"); }, labelled,
       [](Answers& a, const std::string& answer) { apply(a, "data.label_field", answer); }},
      {"Class names by id, comma-separated (`none`: the label values the data holds)",
       [](const Answers&) { return std::string("none"); }, labelled,
       [](Answers& a, const std::string& answer) {
         if (util::ascii_lower(answer) != "none") apply(a, "data.labels", as_list(answer));
       }},
      plain("train.batch_size", "Batch size per process and micro-batch (a number, or auto: the largest that fits)",
            "8"),
      plain("train.steps", "How many optimizer steps?", "1000"),
      plain("optim.lr", "Peak learning rate (AdamW, warm-up then cosine decay)?", "1e-3"),
      plain("launch.num_machines", "How many machines?", "1"),
      plain("launch.machine_rank", "What is the rank of this machine?", "0", several_machines),
      plain("launch.main_process_ip", "What is the IP address of the machine that will host the main process?", "",
            several_machines),
      plain("launch.main_process_port", "What is the port of the main process?", "29500", several_machines),
      plain("launch.num_processes", "How many processes in total (all machines; one per GPU)?", "1"),
      plain("train.device", "Which device (auto: a GPU when one is visible; cpu, cuda)?", "auto"),
      plain("parallel.strategy",
            "Sharding strategy (full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2, ddp)?",
            "full_shard"),
      plain("parallel.mixed_precision", "Mixed precision (no, bf16, fp16)?", "no"),
      plain("parallel.wrap", "Auto wrap policy (transformer, size, none)?", "transformer", sharded),
      {"Transformer layer classes to wrap, comma-separated (empty: the model's own)?",
       [](const Answers&) { return std::string(); },
       [](const Answers& a) {
         return a.config.parallel.strategy != parallel::Strategy::DDP &&
                a.config.parallel.wrap == parallel::Wrap::TRANSFORMER;
       },
       [](Answers& a, const std::string& answer) { apply(a, "parallel.layer_classes", as_list(answer)); }},
      plain("parallel.min_params", "Minimum number of parameters of a unit?", "100000000",
            [](const Answers& a) {
              return a.config.parallel.strategy != parallel::Strategy::DDP &&
                     a.config.parallel.wrap == parallel::Wrap::SIZE;
            }),
      plain("parallel.backward_prefetch", "Backward prefetch (backward_pre, backward_post, none)?", "backward_pre",
            sharded),
      plain("parallel.forward_prefetch", "Units to all-gather ahead in forward (0 = none)?", "0", sharded),
      plain("parallel.offload",
            "Offload (none; cpu: parameters, gradients and optimizer state in host memory; nvme: the optimizer "
            "state on a local disk too)?",
            "none", sharded),
      plain("parallel.nvme_path", "A directory on a local NVMe disk for the optimizer state?", "",
            [](const Answers& a) { return a.config.parallel.offload == parallel::Offload::NVME; }),
      yes_no_question("parallel.activation_checkpointing", "Use activation checkpointing (yes/no)?"),
      plain("checkpoint.state_dict_type", "Checkpoint state dict type (sharded, full)?", "sharded"),
  };
  return q;
}

// The question's prompt as printed: "{tasks}" is the model's tasks.
std::string prompt_of(const Question& q, const Answers& a) {
  std::string prompt = q.prompt.back() == '?' ? q.prompt : q.prompt + "?";
  if (const size_t at = prompt.find("{tasks}"); at != std::string::npos) prompt.replace(at, 7, tasks_prompt(a));
  return prompt;
}

}  // namespace

int run_config_command(const std::vector<std::string>& argv) {
  const Args args = parse_args(argv, {"out"}, {"default", "help"});
  if (args.has("help")) {
    std::cout << "usage: shardtrain config [--default] [--out FILE]\n"
                 "Asks for the model and its task, the data (paths, or a synthetic set written now), batch, steps,\n"
                 "learning rate and output directory, then how the job runs (machines, processes, strategy,\n"
                 "precision, wrapping, offload, checkpointing), checking each answer as it is given, and writes a\n"
                 "YAML config that `shardtrain train` runs (default file: shardtrain_config.yaml). --default prints\n"
                 "the defaults without asking (to FILE with --out); --out - prints the answers.\n";
    return 0;
  }
  // Answers go to a file by default, as `accelerate config` writes its default config file; the defaults alone are
  // printed, for a look or a redirect.
  const std::string out = args.get("out", args.has("default") ? "-" : "shardtrain_config.yaml");
  Answers answers;
  if (!args.has("default")) {
    for (const auto& q : questions()) {
      if (q.applies && !q.applies(answers)) continue;
      while (true) {
        const std::string fallback = q.fallback(answers);
        std::cout << prompt_of(q, answers) << " [" << fallback << "]: " << std::flush;
        std::string answer;
        if (!std::getline(std::cin, answer)) throw std::runtime_error("config: input ended before all answers");
        answer.erase(0, answer.find_first_not_of(" \t"));
        answer.erase(answer.find_last_not_of(" \t") + 1);
        if (answer.empty()) answer = fallback;
        try {
          Answers trial = answers;
          q.set(trial, answer);
          answers = trial;
          break;
        } catch (const std::invalid_argument& e) {  // ConfigError too
          std::cout << "  " << e.what() << "\n";
        }
      }
    }
  }
  config::validate(answers.config);  // values against each other (processes a multiple of machines, ...)
  const std::string yaml = "# shardtrain config (`shardtrain train " + (out == "-" ? std::string("CONFIG") : out) +
                           "`); every key is listed with its value\n" +
                           config::to_yaml(answers.config, /*annotated=*/true);
  if (out == "-") {
    std::cout << yaml;
  } else {
    io::write_file_atomic(out, std::vector<char>(yaml.begin(), yaml.end()));
    std::cout << "config: wrote " << out << " (run it: shardtrain train " << out << ")\n";
  }
  return 0;
}

bool isatty_stderr() { return ::isatty(2) != 0; }
bool isatty_stdin() { return ::isatty(0) != 0; }

}  // namespace shardtrain::cli
