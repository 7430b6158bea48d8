// Reading rank/world/rendezvous from torchrun, Open MPI and Slurm variables, and the errors for bad ones.
#include <gtest/gtest.h>

#include <map>

#include "shardtrain/distributed/env.h"

namespace shardtrain::dist {
namespace {

EnvLookup lookup_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    read_dist_env(lookup_of(std::move(vars)));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(DistEnv, NothingSetIsOneProcessWithoutNetwork) {
  DistEnv env = read_dist_env(lookup_of({}));
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.source, EnvSource::NONE);
  EXPECT_FALSE(env.is_distributed());
}

TEST(DistEnv, Torchrun) {
  DistEnv env = read_dist_env(lookup_of({{"RANK", "5"},
                                         {"WORLD_SIZE", "8"},
                                         {"LOCAL_RANK", "1"},
                                         {"LOCAL_WORLD_SIZE", "4"},
                                         {"GROUP_RANK", "1"},
                                         {"MASTER_ADDR", "node7"},
                                         {"MASTER_PORT", "29511"},
                                         {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  EXPECT_EQ(env.source, EnvSource::TORCHRUN);
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.master_addr, "node7");
  EXPECT_EQ(env.master_port, 29511);
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_FALSE(env.agent_store);  // rank 0 serves the store unless a launcher says it does
}

// torchrun and `shardtrain launch` serve the store themselves and say so with torchrun's variable and spelling.
TEST(DistEnv, TheLaunchersStoreIsUsedWhenItSaysSo) {
  const std::map<std::string, std::string> base = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                                   {"MASTER_PORT", "1234"}};
  auto with = [&](const std::string& value) {
    auto vars = base;
    vars["TORCHELASTIC_USE_AGENT_STORE"] = value;
    return read_dist_env(lookup_of(vars));
  };
  EXPECT_TRUE(with("True").agent_store);
  EXPECT_FALSE(with("False").agent_store);
  EXPECT_FALSE(read_dist_env(lookup_of(base)).agent_store);
}

TEST(DistEnv, TorchrunErrorsNameTheVariable) {
  EXPECT_NE(error_of({{"RANK", "0"}}).find("WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}).find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}).find("MASTER_PORT is not set"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}).find("RANK='x1' is not a non-negative integer"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("RANK=4 is not below WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
                .find("MASTER_PORT=70000 is not a TCP port"),
            std::string::npos);
  // World size 1 from torchrun needs no rendezvous variables.
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}}), "");
}

TEST(DistEnv, OpenMpi) {
  DistEnv env = read_dist_env(lookup_of({{"OMPI_COMM_WORLD_RANK", "3"},
                                         {"OMPI_COMM_WORLD_SIZE", "4"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  EXPECT_EQ(env.source, EnvSource::MPI);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 3);
  EXPECT_EQ(env.master_addr, "127.0.0.1");  // all ranks on this node
  EXPECT_EQ(env.master_port, 29500);
  // Across nodes mpirun does not tell where rank 0 is.
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "3"},
                      {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .find("MASTER_ADDR is not set"),
            std::string::npos);
}

TEST(DistEnv, Slurm) {
  DistEnv env = read_dist_env(lookup_of({{"SLURM_PROCID", "5"},
                                         {"SLURM_NTASKS", "7"},
                                         {"SLURM_LOCALID", "0"},
                                         {"SLURM_NODEID", "3"},
                                         {"SLURM_STEP_ID", "0"},
                                         {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
                                         {"SLURM_STEP_NODELIST", "gpu[07-10]"},
                                         {"SLURM_JOB_ID", "123456"}}));
  EXPECT_EQ(env.source, EnvSource::SLURM);
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 7);
  EXPECT_EQ(env.node_rank, 3);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "gpu07");
  EXPECT_EQ(env.master_port, 15000 + 123456 % 20000);
}

TEST(DistEnv, SlurmBatchScriptWithoutStepIsSingleProcess) {
  // sbatch sets SLURM_PROCID in the batch script itself; only srun steps are distributed jobs.
  DistEnv env = read_dist_env(lookup_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "9"}}));
  EXPECT_EQ(env.world_size, 1);
}

TEST(DistEnv, SlurmNodeLists) {
  EXPECT_EQ(slurm_first_host("node[03-05,9],gpu1"), "node03");
  EXPECT_EQ(slurm_first_host("a1,b2"), "a1");
  EXPECT_EQ(slurm_first_host("solo"), "solo");
  EXPECT_EQ(slurm_first_host("n[1,4]"), "n1");
  EXPECT_THROW(slurm_first_host("n[1-2"), std::invalid_argument);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("8", 0), 8);
  EXPECT_THROW(slurm_tasks_on_node("2(x3),1", 4), std::invalid_argument);
}

}  // namespace
}  // namespace shardtrain::dist
