#include "runtime/ml/policy/kv_cache.hpp"

#include "tests/ml/policy_test_util.hpp"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <stdexcept>
#include <vector>

using namespace sorl::ml;
using sorl::ml::test::small_dims;

namespace {

kv_cache_options four_per_block(std::int64_t initial = 16, std::int64_t max = 0) {
  kv_cache_options o;
  o.block_size = 4;
  o.initial_blocks = initial;
  o.max_blocks = max;
  return o;
}

std::vector<std::int64_t> as_vec(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

}  // namespace

TEST_CASE("a fork shares its parent's blocks until one of them writes", "[kv_cache]") {
  kv_cache c(small_dims(), four_per_block());
  const seq_id a = c.create();
  c.plan_append({a}, {6});  // blocks: [0..3] full, [4..5] partial
  CHECK(c.length(a) == 6);
  CHECK(c.blocks_in_use() == 2);
  const seq_id b = c.fork(a);
  CHECK(c.length(b) == 6);
  CHECK(c.blocks_in_use() == 2);
  c.plan_append({b}, {1});  // writes into the shared partial block: copy it first
  CHECK(c.blocks_in_use() == 3);
  c.plan_append({a}, {1});  // a is now the only owner of the old partial block: in place
  CHECK(c.blocks_in_use() == 3);
  c.release(a);
  CHECK(c.blocks_in_use() == 2);  // the full block stays for b
  c.release(b);
  CHECK(c.blocks_in_use() == 0);
  CHECK(c.num_sequences() == 0);
}

TEST_CASE("a fork of a block-aligned prefix copies nothing", "[kv_cache]") {
  kv_cache c(small_dims(), four_per_block());
  const seq_id a = c.create();
  c.plan_append({a}, {8});
  const seq_id b = c.fork(a);
  const seq_id d = c.fork(a);
  c.plan_append({a, b, d}, {1, 1, 1});  // each starts a fresh block
  CHECK(c.blocks_in_use() == 2 + 3);
}

TEST_CASE("the copy-on-write block carries the shared prefix's keys and values", "[kv_cache]") {
  kv_cache c(small_dims(), four_per_block());
  const seq_id a = c.create();
  const kv_append_plan p = c.plan_append({a}, {3});
  const at::Tensor k0 = c.keys(1);
  k0.index_copy_(0, p.write_slots, at::full({3, k0.size(1)}, 2.5f));
  const seq_id b = c.fork(a);
  const kv_append_plan q = c.plan_append({b}, {1});
  // b's first three slots now live in a new block and hold a's values.
  const std::vector<std::int64_t> b_slots = as_vec(q.gather_slots);
  const std::vector<std::int64_t> a_slots = as_vec(p.write_slots);
  REQUIRE(b_slots.size() == 4);
  CHECK(b_slots[0] != a_slots[0]);
  CHECK(c.keys(1).index_select(0, q.gather_slots.narrow(0, 0, 3)).eq(2.5f).all().item<bool>());
}

TEST_CASE("truncate keeps a prefix and frees whole blocks beyond it", "[kv_cache]") {
  kv_cache c(small_dims(), four_per_block());
  const seq_id a = c.create();
  c.plan_append({a}, {10});
  CHECK(c.blocks_in_use() == 3);
  c.truncate(a, 5);
  CHECK(c.length(a) == 5);
  CHECK(c.blocks_in_use() == 2);
  c.truncate(a, 4);
  CHECK(c.blocks_in_use() == 1);
  c.truncate(a, 0);
  CHECK(c.blocks_in_use() == 0);
  c.plan_append({a}, {2});
  CHECK(c.length(a) == 2);
  CHECK_THROWS_AS(c.truncate(a, 3), std::out_of_range);
  CHECK_THROWS_AS(c.truncate(a, -1), std::out_of_range);
}

TEST_CASE("an append plan indexes a ragged batch as computed by hand", "[kv_cache]") {
  kv_cache c(small_dims(), four_per_block());
  const seq_id a = c.create();
  const seq_id b = c.create();
  c.plan_append({a}, {5});  // a: blocks 1, 2 (slots 4..7, 8)
  const kv_append_plan p = c.plan_append({a, b}, {2, 1});  // a: positions 5, 6; b: block 3, pos 0
  CHECK(p.batch == 2);
  CHECK(p.total_new == 3);
  CHECK(p.max_new == 2);
  CHECK(p.max_len == 7);
  CHECK(as_vec(p.positions) == std::vector<std::int64_t>{5, 6, 0});
  CHECK(as_vec(p.write_slots) == std::vector<std::int64_t>{9, 10, 12});
  CHECK(as_vec(p.gather_slots) ==
        std::vector<std::int64_t>{4, 5, 6, 7, 8, 9, 10, /* b, padded with the zero block */ 12, 0, 0, 0, 0, 0, 0});
  CHECK(as_vec(p.last_rows) == std::vector<std::int64_t>{1, 2});
  CHECK(as_vec(p.pad_rows) == std::vector<std::int64_t>{0, 1, 2, 2});
  CHECK(as_vec(p.unpad_rows) == std::vector<std::int64_t>{0, 1, 2});
  // a's query at position 5 sees keys 0..5; b's only key is 0 (its padded query repeats it).
  CHECK(as_vec(p.masked[0][0]) == std::vector<std::int64_t>{0, 0, 0, 0, 0, 0, 1});
  CHECK(as_vec(p.masked[0][1]) == std::vector<std::int64_t>{0, 0, 0, 0, 0, 0, 0});
  CHECK(as_vec(p.masked[1][0]) == std::vector<std::int64_t>{0, 1, 1, 1, 1, 1, 1});
  CHECK(as_vec(p.masked[1][1]) == std::vector<std::int64_t>{0, 1, 1, 1, 1, 1, 1});
}

TEST_CASE("the pool grows on demand and a block limit fails cleanly", "[kv_cache]") {
  kv_cache grows(small_dims(), four_per_block(1));
  const seq_id a = grows.create();
  grows.plan_append({a}, {20});
  CHECK(grows.blocks_in_use() == 5);
  CHECK(grows.blocks_capacity() >= 5);

  kv_cache bounded(small_dims(), four_per_block(2, 3));
  const seq_id b = bounded.create();
  CHECK_THROWS_WITH(bounded.plan_append({b}, {16}), Catch::Contains("out of blocks"));
  CHECK(bounded.length(b) == 0);  // nothing changed
  CHECK(bounded.blocks_in_use() == 0);
  bounded.plan_append({b}, {12});
  CHECK(bounded.blocks_in_use() == 3);
}

TEST_CASE("rollback restores lengths and frees the blocks of a planned append", "[kv_cache]") {
  kv_cache c(small_dims(), four_per_block());
  const seq_id a = c.create();
  const seq_id b = c.create();
  c.plan_append({a}, {3});
  const kv_append_plan p = c.plan_append({a, b}, {4, 2});
  CHECK(c.blocks_in_use() == 3);
  c.rollback(p);
  CHECK(c.length(a) == 3);
  CHECK(c.length(b) == 0);
  CHECK(c.blocks_in_use() == 1);
}

TEST_CASE("caller mistakes fail naming the values and change nothing", "[kv_cache]") {
  kv_cache c(small_dims(), four_per_block());
  const seq_id a = c.create();
  c.plan_append({a}, {3});
  CHECK_THROWS_WITH(c.plan_append({a, a}, {1, 1}), Catch::Contains("appears twice"));
  CHECK_THROWS_WITH(c.plan_append({a, 99}, {1, 1}), Catch::Contains("unknown sequence 99"));
  CHECK_THROWS_WITH(c.plan_append({a}, {0}), Catch::Contains("need >= 1"));
  CHECK_THROWS_WITH(c.plan_append({a}, {62}), Catch::Contains("exceeds max_seq 64"));
  CHECK(c.length(a) == 3);
  CHECK_THROWS_AS(c.fork(99), std::out_of_range);
  CHECK_THROWS_AS(c.release(99), std::out_of_range);
  CHECK_THROWS_AS(c.length(99), std::out_of_range);
  CHECK_THROWS_AS(c.keys(2), c10::Error);
  kv_cache_options bad;
  bad.block_size = 0;
  CHECK_THROWS_AS(kv_cache(small_dims(), bad), std::invalid_argument);
}
