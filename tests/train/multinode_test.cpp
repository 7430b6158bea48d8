// Two nodes for real: two network namespaces joined by a veth pair, with the test's own addresses from the
// documentation range (192.0.2.1 and 192.0.2.2), one `shardtrain launch` in each, 2 ranks per node, HYBRID_SHARD
// (shard within a node, replicate across). The job trains like one node of 4 ranks sharding everything, its
// rendezvous listens on 192.0.2.1 only, and Gloo's connections cross the veth pair. Needs root (ip netns);
// skipped without it.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/io/files.h"
#include "train/train_harness.h"

namespace shardtrain {
namespace {

using test::Background;
using test::Outcome;

// Two namespaces and the veth pair between them; removed (with the pair) on destruction.
struct TwoNodes {
  std::string a, b;
  std::string va, vb;  // each node's end of the pair
  bool ready = false;

  TwoNodes() {
    const std::string tag = std::to_string(::getpid() % 100000);
    a = "st-a-" + tag, b = "st-b-" + tag;
    va = "stva" + tag, vb = "stvb" + tag;  // interface names: at most 15 characters
    const std::string script = "set -e; ip netns add " + a + "; ip netns add " + b + "; ip link add " + va +
                               " type veth peer name " + vb + "; ip link set " + va + " netns " + a +
                               "; ip link set " + vb + " netns " + b + "; ip -n " + a + " addr add 192.0.2.1/24 dev " +
                               va + "; ip -n " + b + " addr add 192.0.2.2/24 dev " + vb + "; ip -n " + a +
                               " link set " + va + " up; ip -n " + b + " link set " + vb + " up; ip -n " + a +
                               " link set lo up; ip -n " + b + " link set lo up";
    ready = std::system(("(" + script + ") >/dev/null 2>&1").c_str()) == 0;
  }
  ~TwoNodes() { std::system(("ip netns del " + a + " 2>/dev/null; ip netns del " + b + " 2>/dev/null").c_str()); }
};

TEST(MultiNode, TwoNamespacesTrainHybridLikeOneNode) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  const TwoNodes nodes;
  if (!nodes.ready) GTEST_SKIP() << "cannot create network namespaces here (ip netns)";
  const std::string root = "/tmp/shardtrain_multinode_test_" + std::to_string(::getpid());
  const Outcome synth = test::write_flava_suite(root);
  ASSERT_EQ(synth.status, 0) << synth.output;
  const std::string train = std::string(SHARDTRAIN_BIN) + " train " + root + "/config.yaml --train.steps=12 " +
                            "--train.eval_interval=0 --checkpoint.interval=2 --parallel.timeout=60 ";

  // The reference: one node, 4 ranks, FULL_SHARD over all of them.
  const std::string one = root + "/one-node";
  const Outcome reference = test::run(std::string(SHARDTRAIN_BIN) + " launch --nproc-per-node 4 -- " + train +
                                      "--parallel.strategy=full_shard --checkpoint.keep=0 --checkpoint.dir=" + one);
  ASSERT_EQ(reference.status, 0) << reference.output;

  const std::string two = root + "/two-nodes";
  auto node = [&](const std::string& ns, int rank) {
    return "ip netns exec " + ns + " " + SHARDTRAIN_BIN + " launch --nnodes 2 --node-rank " + std::to_string(rank) +
           " --nproc-per-node 2 --master-addr 192.0.2.1 --master-port 29400 --rdzv-id netns-test -- " + train +
           "--parallel.strategy=hybrid_shard --checkpoint.dir=" + two;
  };
  const Background first(node(nodes.a, 0), root + "/node0.txt");
  const Background second(node(nodes.b, 1), root + "/node1.txt");
  // While it runs: what listens in node 0's namespace.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (ckpt::list_checkpoints(two).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const Outcome listening = test::run("ip netns exec " + nodes.a + " ss -ltnH");
  const Outcome r0 = first.wait(), r1 = second.wait();
  ASSERT_EQ(r0.status, 0) << r0.output << "\n---\n" << r1.output;
  ASSERT_EQ(r1.status, 0) << r1.output;
  EXPECT_NE(r0.output.find("on 4 ranks, hybrid_shard"), std::string::npos) << r0.output;
  EXPECT_NE(listening.output.find("192.0.2.1:29400"), std::string::npos) << listening.output;
  EXPECT_EQ(listening.output.find("0.0.0.0:29400"), std::string::npos) << listening.output;
  EXPECT_EQ(listening.output.find("*:29400"), std::string::npos) << listening.output;

  // Sums in another order (within the node, then across) than one reduce-scatter over 4: float32 rounding,
  // enlarged by AdamW where a gradient is near zero, against what 12 steps move the states.
  const auto ours = test::saved_state(two + "/step-00000012", true);
  const auto theirs = test::saved_state(one + "/step-00000012", true);
  // What 12 steps moved the tensors that step 2 had (the heads no batch used by then have no optimizer state yet).
  const auto early = test::saved_state(one + "/step-00000002", true);
  std::map<std::string, at::Tensor> late;
  for (const auto& [name, t] : early) late[name] = theirs.at(name);
  const double moved = test::max_difference(early, late);
  const double diff = test::max_difference(ours, theirs);
  std::printf("two nodes (hybrid) vs one node (full_shard): max difference %.3g, 12 steps moved %.3g\n%s", diff,
              moved, listening.output.c_str());
  EXPECT_GT(moved, 1e-3);
  EXPECT_LE(diff, 0.02 * moved) << "12 steps moved the states by " << moved;
  io::remove_tree(root);
}

// PyTorch programs (tests/launcher/torch_program.py: FSDP2 against one process, a 2 x 2 DeviceMesh) on the same two
// nodes under `shardtrain launch`, as torchrun runs them: node 0's launcher serves the store on 192.0.2.1, Gloo
// uses each node's end of the pair (GLOO_SOCKET_IFNAME, as a torchrun user sets it).
TEST(MultiNode, PyTorchProgramsRunAcrossTwoNamespaces) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  const TwoNodes nodes;
  if (!nodes.ready) GTEST_SKIP() << "cannot create network namespaces here (ip netns)";
  const std::string root = "/tmp/shardtrain_multinode_torch_" + std::to_string(::getpid());
  io::make_directories(root);
  // Both programs in turn in one process group: one Python start a rank.
  auto node = [&](const std::string& ns, const std::string& interface, int rank) {
    return "ip netns exec " + ns + " env GLOO_SOCKET_IFNAME=" + interface + " " + SHARDTRAIN_BIN +
           " launch --nnodes 2 --node-rank " + std::to_string(rank) + " --nproc-per-node 2 --master-addr " +
           "192.0.2.1 --master-port 29401 --rdzv-id netns-torch -- " + SHARDTRAIN_PYTHON + " " + TORCH_PROGRAM +
           " fsdp2,mesh";
  };
  const Background first(node(nodes.a, nodes.va, 0), root + "/node0.txt");
  const Background second(node(nodes.b, nodes.vb, 1), root + "/node1.txt");
  const Outcome r0 = first.wait(), r1 = second.wait();
  EXPECT_EQ(r0.status, 0) << r0.output << "\n---\n" << r1.output;
  EXPECT_EQ(r1.status, 0) << r1.output;
  for (const std::string mode : {"fsdp2", "mesh"}) {
    for (int rank = 0; rank < 4; ++rank) {
      const std::string& out = rank < 2 ? r0.output : r1.output;
      EXPECT_NE(out.find("[rank" + std::to_string(rank) + "]: ok rank " + std::to_string(rank) + ": " + mode),
                std::string::npos) << mode << ":\n" << out;
    }
  }
  io::remove_tree(root);
}

}  // namespace
}  // namespace shardtrain
