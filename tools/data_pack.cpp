// `shardtrain data pack CONFIG.yaml [--section.key=value ...]`: data.packing's token streams of the config's
// data.text and data.eval counted into data.cache_dir now, on every CPU, as the run's start would count them (the
// same files, fields, tokenizer and data.packing_eos: the same cache files), so that a job on GPUs starts by reading
// them. A CPU machine sharing the file system prepares them, as Hugging Face users run datasets' map before training.
#include <iostream>
#include <set>
#include <stdexcept>

#include "cli_args.h"
#include "commands.h"
#include "shardtrain/config/config.h"
#include "shardtrain/data/pipeline/packed_texts.h"
#include "shardtrain/log/log.h"
#include "shardtrain/models/zoo.h"
#include "train/training_data.h"

namespace shardtrain::cli {

int run_data_pack(const std::vector<std::string>& args) {
  if (args.empty() || args[0].rfind("--", 0) == 0) {
    throw std::invalid_argument("data pack takes a trainer config: shardtrain data pack CONFIG.yaml "
                                "[--section.key=value ...]");
  }
  config::Config c = config::load_config(args[0], config_overrides(args, 1));
  c.data.packing = true;
  if (c.data.cache_dir == "none") {
    throw std::invalid_argument("data.cache_dir: none keeps no stream; data pack counts into a cache directory");
  }
  const auto recipe = models::recipe_for_task(models::recipe_of_model(c.model.flavor, c.model.overrides),
                                              c.model.task, {});
  const auto task = recipe->task(c.model.task);
  const log::Logger logger(log::console_sink(), 0);
  const train::TrainingData data = train::open_training_data(c, *task, train::open_run_tokenizer(c), 0, 1, logger);
  train::describe_data(data, logger);
  for (const data::PackedTexts* p : {data.options.packed.get(), data.eval_packed.get()}) {
    if (p && p->where() != data::PackedTexts::Where::CACHE_FILE) {
      throw std::runtime_error("data pack: a stream could not be cached (" + p->describe() + ")");
    }
  }
  return 0;
}

}  // namespace shardtrain::cli
