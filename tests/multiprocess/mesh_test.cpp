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
      {"mesh replicate(2) * shard(" + std::to_string(w + 1) + ") = " + std::to_string(2 * (w + 1)) +
       " != WORLD_SIZE(" + std::to_string(w) + ")"});
}

}  // namespace
}  // namespace shardtrain::dist
