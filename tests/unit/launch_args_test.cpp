// `shardtrain launch` argument parsing: torchrun's and Accelerate's spellings, and the errors.
#include <gtest/gtest.h>

#include "shardtrain/launch/launch.h"

namespace shardtrain::launch {
namespace {

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_launch_args(args);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchArgs, TorchrunSpellings) {
  auto o = parse_launch_args({"--nproc-per-node", "4", "--nnodes=2", "--node_rank", "1", "--master-addr", "h0",
                              "--master_port=29400", "--max-restarts", "3", "--", "prog", "--flag", "x"});
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "h0");
  EXPECT_EQ(o.master_port, 29400);
  EXPECT_EQ(o.max_restarts, 3);
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "--flag", "x"}));
}

TEST(LaunchArgs, ProgramWithoutSeparator) {
  auto o = parse_launch_args({"--nproc_per_node=2", "prog", "--nnodes", "9"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.nnodes, 1);  // options after the program belong to the program
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "--nnodes", "9"}));
}

TEST(LaunchArgs, AccelerateSpellingsCountAllProcesses) {
  auto o = parse_launch_args({"--num_processes", "8", "--num_machines", "2", "--machine_rank", "1",
                              "--main_process_ip", "10.1.2.3", "--main_process_port", "29600", "train"});
  EXPECT_EQ(o.nproc_per_node, 4);  // 8 processes over 2 machines
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "10.1.2.3");
  EXPECT_EQ(o.master_port, 29600);
  EXPECT_EQ(parse_launch_args({"--gpu_ids", "0,2", "train"}).gpu_ids, "0,2");
  EXPECT_EQ(parse_launch_args({"--gpu-ids=all", "train"}).gpu_ids, "all");
}

TEST(LaunchArgs, Defaults) {
  auto o = parse_launch_args({"prog"});
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.master_port, 0);  // a free port is chosen
  EXPECT_TRUE(o.master_addr.empty());
}

// torchrun's elastic form: --nnodes MIN:MAX, the endpoint, the rendezvous's timing.
TEST(LaunchArgs, ElasticNodesAndTheRendezvous) {
  auto o = parse_launch_args({"--nnodes=2:3", "--nproc-per-node", "2", "--rdzv-endpoint", "10.0.0.1:29400",
                              "--rdzv-conf", "last_call_timeout=1.5,join_timeout=60,keep_alive_interval=2,"
                              "keep_alive_max_attempt=5", "--rdzv-id", "j", "p"});
  EXPECT_EQ(o.min_nodes, 2);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 29400);
  EXPECT_EQ(o.last_call, std::chrono::milliseconds(1500));
  EXPECT_EQ(o.join_timeout, std::chrono::milliseconds(60000));
  EXPECT_EQ(o.keep_alive_interval, std::chrono::milliseconds(2000));
  EXPECT_EQ(o.keep_alive_max_attempt, 5);
  EXPECT_EQ(parse_launch_args({"--nnodes", "4", "--master-addr", "h", "p"}).min_nodes, 0);  // static
}

TEST(LaunchArgs, ErrorsNameTheOptionAndValue) {
  EXPECT_NE(error_of({"--nproc-per-nod", "2", "p"}).find("unknown option '--nproc-per-nod' (did you mean "
                                                         "--nproc-per-node?)"),
            std::string::npos);
  EXPECT_NE(error_of({"--nproc-per-node", "two", "p"}).find("--nproc-per-node 'two' is not an integer >= 1"),
            std::string::npos);
  EXPECT_NE(error_of({"--nproc-per-node", "0", "p"}).find("'0' is not an integer >= 1"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "2", "p"}).find("--master-addr is required with --nnodes 2"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "p"})
                .find("--node-rank 2 is not below --nnodes 2"),
            std::string::npos);
  EXPECT_NE(error_of({"--num_processes", "3", "--num_machines", "2", "--master-addr", "h", "p"})
                .find("--num-processes 3 is not divisible by --num-machines 2"),
            std::string::npos);
  EXPECT_NE(error_of({"--num_processes", "4", "--nproc-per-node", "3", "p"}).find("contradicts"), std::string::npos);
  EXPECT_NE(error_of({"--master-port", "99999", "p"}).find("not a TCP port"), std::string::npos);
  EXPECT_NE(error_of({"--nproc-per-node", "2"}).find("no program to launch"), std::string::npos);
  EXPECT_NE(error_of({"--nproc-per-node"}).find("needs a value"), std::string::npos);
  // Elastic: MIN above MAX, a node rank the rendezvous assigns, an unknown rendezvous setting.
  EXPECT_NE(error_of({"--nnodes", "3:2", "p"}).find("--nnodes 3:2: MIN 3 is greater than MAX 2"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "2:3", "--node-rank", "1", "p"})
                .find("an elastic job's node ranks come from the rendezvous; leave --node-rank out"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "2:x", "p"}).find("--nnodes 'x' is not an integer >= 1"), std::string::npos);
  EXPECT_NE(error_of({"--rdzv-conf", "timeout=3", "p"}).find("--rdzv-conf 'timeout=3': expected last_call_timeout"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv-endpoint", ":29500", "p"}).find("expected HOST[:PORT]"), std::string::npos);
  for (const std::string bad : {"0,x", "", "0,,1", "-1"}) {
    EXPECT_NE(error_of({"--gpu-ids", bad, "p"}).find("--gpu-ids '" + bad + "': expected all, or GPU indices"),
              std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace shardtrain::launch
