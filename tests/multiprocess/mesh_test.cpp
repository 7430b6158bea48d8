// Sub-groups of a 2-D mesh: shard groups are rows, replicate groups columns. At W = 4 the 2x2 layout of hybrid
// sharding; at every W the degenerate layouts 1xW and Wx1; wrong shapes are errors naming the sizes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_env.h"
#include "shardtrain/distributed/mesh.h"
#include "support/expect_error.h"

namespace shardtrain::dist {
namespace {

using testing::test_process_group;

// Checks that every collective in both sub-groups reaches exactly the ranks the layout says.
void check_mesh(int replicate, int shard) {
  ProcessGroup& pg = test_process_group();
  DeviceMesh mesh = DeviceMesh::create(pg, replicate, shard);
  const int me = pg.rank();
  const int row = me / shard, col = me % shard;
  EXPECT_EQ(mesh.replicate_rank(), row);
  EXPECT_EQ(mesh.shard_rank(), col);
  ASSERT_EQ(mesh.shard_group().size(), shard);
  ASSERT_EQ(mesh.replicate_group().size(), replicate);

  // all_reduce of the world rank: a row sums its own ranks, a column its own.
  at::Tensor row_sum = at::full({3}, static_cast<double>(me), at::kDouble);
  mesh.shard_group().all_reduce(row_sum, ReduceOp::SUM).wait();
  double expected_row = 0;
  for (int c = 0; c < shard; ++c) expected_row += row * shard + c;
  EXPECT_EQ(row_sum[2].item<double>(), expected_row) << replicate << "x" << shard << " shard group of rank " << me;

  at::Tensor col_sum = at::full({3}, static_cast<double>(me), at::kDouble);
  mesh.replicate_group().all_reduce(col_sum, ReduceOp::SUM).wait();
  double expected_col = 0;
  for (int r = 0; r < replicate; ++r) expected_col += r * shard + col;
  EXPECT_EQ(col_sum[0].item<double>(), expected_col) << replicate << "x" << shard << " replicate group of rank " << me;

  // Hybrid sharding's gradient path: reduce-scatter in the row, then all-reduce the shard across rows; the result
  // is the world sum of this rank's column chunk.
  const int64_t n = 7;
  at::Tensor grad = at::arange(shard * n, at::kFloat) + 100 * me;
  at::Tensor shard_out = at::empty({n});
  mesh.shard_group().reduce_scatter(shard_out, grad, ReduceOp::SUM).wait();
  mesh.replicate_group().all_reduce(shard_out, ReduceOp::SUM).wait();
  at::Tensor expected = at::zeros({n});
  for (int r = 0; r < pg.world_size(); ++r) expected += (at::arange(shard * n, at::kFloat) + 100 * r).narrow(0, col * n, n);
  EXPECT_TRUE(at::equal(shard_out, expected)) << replicate << "x" << shard << " hybrid reduction on rank " << me;

  // all_gather in the column: the same position of every row.
  at::Tensor gathered = at::empty({replicate});
  mesh.replicate_group().all_gather(gathered, at::full({1}, static_cast<double>(me), at::kFloat)).wait();
  for (int r = 0; r < replicate; ++r) EXPECT_EQ(gathered[r].item<float>(), r * shard + col);
}

TEST(Mesh, OneRowOfWorldSize) { check_mesh(1, test_process_group().world_size()); }

TEST(Mesh, OneColumnOfWorldSize) { check_mesh(test_process_group().world_size(), 1); }

TEST(Mesh, TwoByTwo) {
  if (test_process_group().world_size() != 4) GTEST_SKIP() << "2x2 needs world size 4";
  check_mesh(2, 2);
}

TEST(Mesh, InferredShardSize) {
  DeviceMesh mesh = DeviceMesh::create(test_process_group(), 1);
  EXPECT_EQ(mesh.shard_size(), test_process_group().world_size());
}

TEST(Mesh, WrongShapeNamesTheSizes) {
  const int w = test_process_group().world_size();
  testing::expect_error<std::invalid_argument>(
      [&] { DeviceMesh::create(test_process_group(), 2, w + 1); },
      {"mesh replicate(2) * shard(" + std::to_string(w + 1) + ") * tp(1) = " + std::to_string(2 * (w + 1)) +
       " != WORLD_SIZE(" + std::to_string(w) + ")"});
  testing::expect_error<std::invalid_argument>([&] { DeviceMesh::create(test_process_group(), 1, -1, w + 1); },
                                               {"tp(" + std::to_string(w + 1) + ") does not divide WORLD_SIZE"});
}

// The sum of the world ranks of `group`'s members, through the group: which ranks it reaches.
double member_sum(const Communicator& group) {
  at::Tensor t = at::full({1}, static_cast<double>(test_process_group().rank()), at::kDouble);
  group.all_reduce(t, ReduceOp::SUM).wait();
  return t.item<double>();
}

// Every group of a replicate x shard x tp mesh reaches the ranks the layout (mesh.h) says, and each rank's
// coordinates are its own.
void check_tp_mesh(int replicate, int shard, int tp) {
  const int w = test_process_group().world_size(), me = test_process_group().rank();
  DeviceMesh mesh = DeviceMesh::create(test_process_group(), replicate, shard, tp);
  const int row = me / tp / shard, col = me / tp % shard, t = me % tp;
  const std::string label = std::to_string(replicate) + "x" + std::to_string(shard) + "x" + std::to_string(tp);
  EXPECT_EQ(mesh.replicate_rank(), row) << label;
  EXPECT_EQ(mesh.shard_rank(), col) << label;
  EXPECT_EQ(mesh.tp_rank(), t) << label;
  EXPECT_EQ(mesh.data_rank(), row * shard + col) << label;
  EXPECT_EQ(mesh.data_size(), replicate * shard) << label;
  double shard_sum = 0, replicate_sum = 0, tp_sum = 0, data_sum = 0;
  for (int r = 0; r < w; ++r) {
    const int r_row = r / tp / shard, r_col = r / tp % shard, r_t = r % tp;
    if (r_row == row && r_t == t) shard_sum += r;
    if (r_col == col && r_t == t) replicate_sum += r;
    if (r_row == row && r_col == col) tp_sum += r;
    if (r_t == t) data_sum += r;
  }
  EXPECT_EQ(member_sum(mesh.shard_group()), shard_sum) << label << " shard group of rank " << me;
  EXPECT_EQ(member_sum(mesh.replicate_group()), replicate_sum) << label << " replicate group of rank " << me;
  EXPECT_EQ(member_sum(mesh.tp_group()), tp_sum) << label << " tensor-parallel group of rank " << me;
  EXPECT_EQ(member_sum(mesh.data_group()), data_sum) << label << " data-parallel group of rank " << me;
}

// The same with a pipeline dimension outermost (pp x replicate x shard x tp): each stage's groups stay within its
// ranks, and the pipeline group links the ranks of one (row, col, t), one per stage, in stage order.
void check_pp_mesh(int pp, int replicate, int shard, int tp) {
  const int w = test_process_group().world_size(), me = test_process_group().rank();
  DeviceMesh mesh = DeviceMesh::create(test_process_group(), replicate, shard, tp, pp);
  const int stage = replicate * shard * tp, p = me / stage, in = me % stage;
  const int row = in / tp / shard, col = in / tp % shard, t = in % tp;
  const std::string label = std::to_string(pp) + "x" + std::to_string(replicate) + "x" + std::to_string(shard) + "x" +
                            std::to_string(tp);
  EXPECT_EQ(mesh.pp_rank(), p) << label;
  EXPECT_EQ(mesh.pp_size(), pp) << label;
  EXPECT_EQ(mesh.data_rank(), row * shard + col) << label;
  EXPECT_EQ(mesh.data_size(), replicate * shard) << label;
  double shard_sum = 0, replicate_sum = 0, tp_sum = 0, data_sum = 0, pp_sum = 0;
  for (int r = 0; r < w; ++r) {
    const int r_p = r / stage, r_in = r % stage;
    const int r_row = r_in / tp / shard, r_col = r_in / tp % shard, r_t = r_in % tp;
    if (r_p == p && r_row == row && r_t == t) shard_sum += r;
    if (r_p == p && r_col == col && r_t == t) replicate_sum += r;
    if (r_p == p && r_row == row && r_col == col) tp_sum += r;
    if (r_p == p && r_t == t) data_sum += r;
    if (r_in == in) pp_sum += r;
  }
  EXPECT_EQ(member_sum(mesh.shard_group()), shard_sum) << label << " shard group of rank " << me;
  EXPECT_EQ(member_sum(mesh.replicate_group()), replicate_sum) << label << " replicate group of rank " << me;
  EXPECT_EQ(member_sum(mesh.tp_group()), tp_sum) << label << " tensor-parallel group of rank " << me;
  EXPECT_EQ(member_sum(mesh.data_group()), data_sum) << label << " data-parallel group of rank " << me;
  EXPECT_EQ(member_sum(mesh.pp_group()), pp_sum) << label << " pipeline group of rank " << me;
  EXPECT_EQ(mesh.pp_group().rank(), p) << label;  // in stage order
}

TEST(Mesh, PipelineLayouts) {
  const int w = test_process_group().world_size();
  check_pp_mesh(w, 1, 1, 1);
  check_pp_mesh(1, 1, w, 1);
  if (w == 4) {
    check_pp_mesh(2, 1, 2, 1);
    check_pp_mesh(2, 1, 1, 2);
    check_pp_mesh(2, 2, 1, 1);
  }
  testing::expect_error<std::invalid_argument>([&] { DeviceMesh::create(test_process_group(), 1, 1, 1, w + 1); },
                                               {"mesh pp(" + std::to_string(w + 1) + ") * replicate(1) * shard(1) * "
                                                "tp(1) = " + std::to_string(w + 1) + " != WORLD_SIZE"});
}

TEST(Mesh, TensorParallelLayouts) {
  const int w = test_process_group().world_size();
  check_tp_mesh(1, w, 1);
  check_tp_mesh(1, 1, w);
  if (w == 4) {
    check_tp_mesh(1, 2, 2);
    check_tp_mesh(2, 1, 2);
  }
}

}  // namespace
}  // namespace shardtrain::dist
