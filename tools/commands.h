// The sub-commands of the `shardtrain` executable (tools/main.cpp dispatches). Each returns the exit status and
// throws on errors, which main turns into messages.
#pragma once

#include <string>
#include <vector>

namespace shardtrain::cli {

int run_data_command(const std::vector<std::string>& args);        // data synth | vocab | show | pack | cache
int run_data_pack(const std::vector<std::string>& args);           // data pack CONFIG [--k=v ...]
int run_data_cache(const std::vector<std::string>& args);          // data cache [DIR] [--prune | --clear]
int run_config_command(const std::vector<std::string>& args);      // config [--default] [--out FILE]
int run_train_command(const std::vector<std::string>& args);       // train CONFIG [--k=v ...]
int run_checkpoint_command(const std::vector<std::string>& args);  // checkpoint export | verify | list
int run_estimate_command(const std::vector<std::string>& args);    // estimate-memory MODEL [--dtypes ...]
int run_plan_command(const std::vector<std::string>& args);        // plan MODEL --gpus N --gpu-memory S
int run_generate_command(const std::vector<std::string>& args);    // generate MODEL [PROMPT...]
int run_report_command(const std::vector<std::string>& args);      // report RUN_DIR... [--out DIR]
int run_env_command(const std::vector<std::string>& args);         // env

bool isatty_stderr();
bool isatty_stdin();

}  // namespace shardtrain::cli
