#include "runtime/ml/policy/prefix_cache.hpp"

#include "runtime/ml/policy/generate.hpp"
#include "tests/ml/policy_test_util.hpp"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <stdexcept>
#include <vector>

using namespace sorl::ml;
using sorl::ml::test::small_dims;
using sorl::ml::test::small_init_std;
using sorl::ml::test::tokens;

namespace {

constexpr std::int64_t bs = 16;  // kv_cache_options' default block size

// A sequence of `n` positions in `cache` (its KV content does not matter to the tree).
seq_id filled(kv_cache& cache, std::int64_t n) {
  const seq_id s = cache.create();
  cache.plan_append({s}, {n});
  return s;
}

// `a` with its token at `at` changed.
std::vector<std::int32_t> changed(std::vector<std::int32_t> a, std::size_t at) {
  a.at(at) = (a[at] + 1) % 40;
  return a;
}

sampling_params sampled(std::uint64_t seed, std::int64_t max_new) {
  sampling_params p;
  p.temperature = 1.0;
  p.max_new_tokens = max_new;
  p.seed = seed;
  return p;
}

generator_options with_prefix_cache(std::int64_t tokens) {
  generator_options o;
  o.prefix_cache_tokens = tokens;
  return o;
}

// Results keyed by sample index (one request).
std::map<std::int64_t, generation_result> run_one(generator& g, const std::vector<std::int32_t>& prompt,
                                                  const sampling_params& p, std::int64_t group = 1) {
  g.submit(prompt, p, group);
  std::map<std::int64_t, generation_result> out;
  for (auto& r : g.run_until_idle()) out[r.sample_index] = std::move(r);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Log-probs of the same tokens computed over other row counts: a cache hit prefills only the
// uncached rows, and fp32 GEMMs over other row counts round differently in the last bits
// (|d logit| ~ 2e-6 seen here), as they do when a batch's composition changes (sampler.hpp).
// 1e-5 on log-probs of magnitude ~1-5 holds with room and catches any wrong KV or position.
void check_close(const std::vector<float>& got, const std::vector<float>& ref) {
  REQUIRE(got.size() == ref.size());
  for (std::size_t j = 0; j < ref.size(); ++j) CHECK(got[j] == Approx(ref[j]).margin(1e-5));
}

}  // namespace

TEST_CASE("the prefix tree serves the longest cached prefix of whole blocks, and only true prefixes", "[prefix_cache]") {
  kv_cache cache(small_dims());
  prefix_cache tree(cache, 1000);
  const std::vector<std::int32_t> a = tokens(40, 40, 1);
  const seq_id s = filled(cache, 40);
  tree.insert(a, 40, s);
  CHECK(tree.cached_blocks() == 2);  // 40 tokens: two whole blocks, the partial third never
  CHECK(tree.consistent());
  std::vector<std::int32_t> got;
  CHECK(tree.match(a, 40, got) == 32);
  CHECK(got == std::vector<std::int32_t>{cache.blocks(s)[0], cache.blocks(s)[1]});
  CHECK(tree.match(a, 31, got) == 16);  // the limit cuts the second block
  CHECK(got.size() == 1);
  CHECK(tree.match(a, 15, got) == 0);
  CHECK(got.empty());
  // The same first token, then different ones: nothing past the differing block is shared.
  CHECK(tree.match(changed(a, 1), 40, got) == 0);
  CHECK(tree.match(changed(a, 15), 40, got) == 0);
  CHECK(tree.match(changed(a, 16), 40, got) == 16);
  CHECK(tree.match(changed(a, 31), 40, got) == 16);
  CHECK(tree.match(changed(a, 35), 40, got) == 32);  // in the partial block: not cached anyway
  const std::vector<std::int32_t> other = tokens(40, 40, 2);
  CHECK(tree.match(other, 40, got) == 0);
  const prefix_cache_stats st = tree.take_stats();
  CHECK(st.lookups == 9);
  CHECK(st.lookup_tokens == 40 + 31 + 15 + 40 * 6);
  CHECK(st.hit_tokens == 32 + 16 + 16 + 16 + 32);
  CHECK(st.inserted_blocks == 2);
  CHECK_THROWS_AS(tree.match(a, 41, got), std::invalid_argument);
  CHECK_THROWS_AS(tree.insert(a, 41, s), std::invalid_argument);
}

TEST_CASE("cached blocks outlive their sequence and are freed with the tree's last reference", "[prefix_cache]") {
  kv_cache cache(small_dims());
  {
    prefix_cache tree(cache, 1000);
    const std::vector<std::int32_t> a = tokens(40, 40, 3);
    const seq_id s = filled(cache, 40);
    const std::vector<std::int32_t> blocks = cache.blocks(s);
    tree.insert(a, 40, s);
    CHECK(cache.refcount(blocks[0]) == 2);
    CHECK(cache.refcount(blocks[2]) == 1);  // the partial block stays the sequence's alone
    cache.release(s);
    CHECK(cache.blocks_in_use() == 2);
    // A sequence adopted from the cached blocks appends after them; a second insert of the
    // same path keeps the nodes and adds only the new whole block.
    std::vector<std::int32_t> got;
    REQUIRE(tree.match(a, 39, got) == 32);
    const seq_id t = cache.adopt(got, 32);
    cache.plan_append({t}, {20});
    std::vector<std::int32_t> longer = a;
    longer.resize(52, 7);
    tree.insert(longer, 52, t);
    CHECK(tree.cached_blocks() == 3);
    CHECK(tree.consistent());
    cache.release(t);
    CHECK(cache.blocks_in_use() == 3);
  }
  CHECK(cache.blocks_in_use() == 0);
}

TEST_CASE("past its budget the tree evicts the least recently used leaf first", "[prefix_cache]") {
  kv_cache cache(small_dims());
  prefix_cache tree(cache, 3 * bs + 5);  // three whole blocks
  CHECK(tree.max_blocks() == 3);
  const std::vector<std::int32_t> a = tokens(32, 40, 4), b = tokens(32, 40, 5), c = tokens(32, 40, 6);
  std::vector<std::int32_t> got;
  const seq_id sa = filled(cache, 32), sb = filled(cache, 32), sc = filled(cache, 32);
  tree.insert(a, 32, sa);  // a1 a2
  tree.insert(b, 32, sb);  // past 3: a's leaf a2 (least recent) goes
  CHECK(tree.cached_blocks() == 3);
  CHECK(tree.match(a, 32, got) == 16);
  CHECK(tree.match(b, 32, got) == 32);
  // a1 was matched before b: a1 is the oldest leaf now; c's two blocks push out a1, then b2.
  tree.insert(c, 32, sc);
  CHECK(tree.cached_blocks() == 3);
  CHECK(tree.match(a, 32, got) == 0);
  CHECK(tree.match(b, 32, got) == 16);
  CHECK(tree.match(c, 32, got) == 32);
  CHECK(tree.stats().evicted_blocks == 3);
  CHECK(tree.consistent());
  for (const seq_id s : {sa, sb, sc}) cache.release(s);
  CHECK(cache.blocks_in_use() == 3);
  prefix_cache none(cache, bs - 1);  // less than a block: holds nothing
  none.insert(a, 32, [&] { return filled(cache, 32); }());
  CHECK(none.cached_blocks() == 0);
}

TEST_CASE("a hit never crosses weight versions", "[prefix_cache]") {
  kv_cache cache(small_dims());
  prefix_cache tree(cache, 1000, 7);
  const std::vector<std::int32_t> a = tokens(48, 40, 8);
  const seq_id s = filled(cache, 48);
  tree.insert(a, 48, s);
  cache.release(s);
  std::vector<std::int32_t> got;
  CHECK(tree.match(a, 48, got) == 48);
  tree.set_version(7);  // unchanged: kept
  CHECK(tree.cached_blocks() == 3);
  tree.set_version(8);
  CHECK(tree.version() == 8);
  CHECK(tree.cached_blocks() == 0);
  CHECK(tree.match(a, 48, got) == 0);
  CHECK(tree.stats().invalidated_blocks == 3);
  CHECK(cache.blocks_in_use() == 0);
  CHECK_THROWS_AS(prefix_cache(cache, -1), std::invalid_argument);
}

TEST_CASE("a prompt-prefix hit gives the tokens and log-probs of prefilling the whole prompt", "[prefix_cache][generate]") {
  const policy_model m(small_dims(), 40, small_init_std);
  const std::vector<std::int32_t> shared = tokens(35, 40, 9);
  std::vector<std::int32_t> first = shared, second = shared;
  const std::vector<std::int32_t> x = tokens(5, 40, 10), y = tokens(7, 40, 11);
  first.insert(first.end(), x.begin(), x.end());
  second.insert(second.end(), y.begin(), y.end());
  generator cached(m, with_prefix_cache(1024));
  run_one(cached, first, sampled(3, 6));
  cached.take_prefill_stats();
  const auto got = run_one(cached, second, sampled(4, 8), 3);
  const prefill_stats st = cached.take_prefill_stats();
  CHECK(st.prompt_tokens == 42);
  CHECK(st.hit_tokens == 32);
  CHECK(st.computed_tokens == 10);
  generator plain(m);
  const auto ref = run_one(plain, second, sampled(4, 8), 3);
  for (std::int64_t i = 0; i < 3; ++i) {
    CHECK(got.at(i).tokens == ref.at(i).tokens);
    check_close(got.at(i).logprobs, ref.at(i).logprobs);
    // The first sample computed the 10 uncached tokens; its siblings forked all 42.
    CHECK(got.at(i).cached_tokens == (i == 0 ? 32 : 42));
    CHECK(ref.at(i).cached_tokens == (i == 0 ? 0 : 42));
  }
}

TEST_CASE("prompts sharing uncached blocks are not prefilled together: the later waits one step and hits",
          "[prefix_cache][generate]") {
  const policy_model m(small_dims(), 44, small_init_std);
  const std::vector<std::int32_t> shared = tokens(40, 40, 9);  // two whole blocks and 8 tokens
  auto with_tail = [&](std::int32_t seed) {
    std::vector<std::int32_t> p = shared;
    const std::vector<std::int32_t> t = tokens(6, 40, seed);
    p.insert(p.end(), t.begin(), t.end());
    return p;
  };
  const std::vector<std::int32_t> other = tokens(20, 40, 30);
  for (const bool defer : {true, false}) {
    INFO("defer_shared_prefill = " << defer);
    generator_options o = with_prefix_cache(1024);
    o.defer_shared_prefill = defer;
    generator g(m, o);
    const auto a = g.submit(with_tail(10), sampled(1, 4), 2);
    const auto b = g.submit(with_tail(11), sampled(2, 4), 2);
    const auto c = g.submit(other, sampled(3, 4), 1);  // behind b, nothing in common: admitted
    g.step();
    CHECK(g.live_samples() == (defer ? 3 : 5));
    CHECK(g.queued_requests() == (defer ? 1 : 0));
    std::map<std::uint64_t, generation_result> first;
    for (auto& r : g.run_until_idle())
      if (r.sample_index == 0) first[r.request_id] = std::move(r);
    const prefill_stats st = g.take_prefill_stats();
    CHECK(st.prompt_tokens == 46 + 46 + 20);
    // Deferred, b finds a's two whole blocks cached; admitted with a, it prefills them again.
    CHECK(st.hit_tokens == (defer ? 32 : 0));
    CHECK(first.at(a).cached_tokens == 0);
    CHECK(first.at(b).cached_tokens == (defer ? 32 : 0));
    CHECK(first.at(c).cached_tokens == 0);
  }
}

TEST_CASE("a next turn served from a finished turn's blocks matches a fresh prefill of the chat", "[prefix_cache][generate]") {
  // The finished turn's response KV was computed by one-token decode passes, a fresh prefill
  // computes it in one pass: as for parked KV (generate_test.cpp), see check_close.
  const policy_model m(small_dims(), 41, small_init_std);
  generator cached(m, with_prefix_cache(1024));
  const std::vector<std::int32_t> first = tokens(9, 40, 12);
  const auto turn1 = run_one(cached, first, sampled(5, 30));
  std::vector<std::int32_t> second = first;
  second.insert(second.end(), turn1.at(0).tokens.begin(), turn1.at(0).tokens.end());
  const std::vector<std::int32_t> obs = tokens(6, 40, 13);
  second.insert(second.end(), obs.begin(), obs.end());
  cached.take_prefill_stats();
  const auto got = run_one(cached, second, sampled(6, 10));
  const prefill_stats st = cached.take_prefill_stats();
  const auto cached_len = static_cast<std::int64_t>(first.size() + turn1.at(0).tokens.size()) - 1;
  CHECK(st.hit_tokens == cached_len / bs * bs);
  generator plain(m);
  const auto ref = run_one(plain, second, sampled(6, 10));
  CHECK(got.at(0).tokens == ref.at(0).tokens);
  check_close(got.at(0).logprobs, ref.at(0).logprobs);
}

TEST_CASE("an episode's parked turns stay out of the tree: only its first prompt is shared", "[prefix_cache][generate]") {
  const policy_model m(small_dims(), 43, small_init_std);
  generator g(m, with_prefix_cache(1024));
  const std::vector<std::int32_t> first = tokens(24, 40, 21);  // 1 whole block + 8 (max_seq 64)
  g.submit(first, sampled(8, 8), 1, {}, kv_reuse{true, 0});
  const auto turn1 = g.run_until_idle();
  REQUIRE(turn1.size() == 1);
  REQUIRE(turn1[0].parked != 0);
  CHECK(g.take_prefill_stats().cached_blocks == 1);  // the prompt, not the parked turn
  std::vector<std::int32_t> chat = first;
  chat.insert(chat.end(), turn1[0].tokens.begin(), turn1[0].tokens.end());
  const std::vector<std::int32_t> obs = tokens(6, 40, 22);
  chat.insert(chat.end(), obs.begin(), obs.end());
  g.submit(chat, sampled(9, 8), 1, {}, kv_reuse{true, turn1[0].parked});
  const auto turn2 = g.run_until_idle();
  REQUIRE(turn2.size() == 1);
  prefill_stats st = g.take_prefill_stats();
  CHECK(st.parked_tokens == static_cast<std::int64_t>(first.size() + turn1[0].tokens.size()) - 1);
  REQUIRE(chat.size() >= 2 * bs);  // the chat holds 2 whole blocks...
  CHECK(st.cached_blocks == 1);  // ...but it is the episode's own
  // Another prompt that starts with the chat finds the first prompt's blocks, nothing more.
  run_one(g, chat, sampled(10, 4));
  st = g.take_prefill_stats();
  CHECK(st.hit_tokens == bs);
  CHECK(g.release(turn2[0].parked));
}

TEST_CASE("under a one-block budget every result stays that of plain generation", "[prefix_cache][generate]") {
  const policy_model m(small_dims(), 42, small_init_std);
  generator tiny(m, with_prefix_cache(bs));
  generator plain(m);
  const std::vector<std::int32_t> stem = tokens(20, 40, 14);
  for (std::uint32_t k = 0; k < 12; ++k) {
    // Prompts share 20, 4 or 0 tokens with each other, so hits, misses and evictions mix.
    std::vector<std::int32_t> p(stem.begin(), stem.begin() + (k % 3 == 0 ? 20 : k % 3 == 1 ? 4 : 0));
    const std::vector<std::int32_t> tail = tokens(18 + k % 5, 40, 15 + k);
    p.insert(p.end(), tail.begin(), tail.end());
    tiny.submit(p, sampled(20 + k, 5), 2);
    plain.submit(p, sampled(20 + k, 5), 2);
  }
  std::map<std::pair<std::uint64_t, std::int64_t>, generation_result> a, b;
  for (auto& r : tiny.run_until_idle()) a[{r.request_id, r.sample_index}] = std::move(r);
  for (auto& r : plain.run_until_idle()) b[{r.request_id, r.sample_index}] = std::move(r);
  REQUIRE(a.size() == b.size());
  for (const auto& [key, r] : b) {
    CHECK(a.at(key).tokens == r.tokens);
    check_close(a.at(key).logprobs, r.logprobs);
  }
  REQUIRE(tiny.prefixes() != nullptr);
  CHECK(tiny.prefixes()->cached_blocks() <= 1);
  CHECK(tiny.prefixes()->consistent());
  const prefill_stats st = tiny.take_prefill_stats();
  CHECK(st.evicted_blocks > 0);
  CHECK(st.prompt_tokens == st.hit_tokens + st.computed_tokens);
  // Idle, the pool holds only what the tree holds.
  CHECK(tiny.cache().blocks_in_use() == tiny.prefixes()->cached_blocks());
}

TEST_CASE("a weight change drops the prefix cache and the next prompt is prefilled under the new weights", "[prefix_cache][generate]") {
  policy_model m(small_dims(), 43, small_init_std);
  const policy_model next(small_dims(), 44, small_init_std);
  generator g(m, with_prefix_cache(1024));
  const std::vector<std::int32_t> prompt = tokens(40, 40, 16);
  run_one(g, prompt, sampled(7, 4));
  REQUIRE(g.prefixes()->cached_blocks() >= 2);
  m.copy_weights_from(next);
  g.set_weights_version(1);
  CHECK(g.prefixes()->cached_blocks() == 0);
  g.take_prefill_stats();
  const auto got = run_one(g, prompt, sampled(8, 6));
  CHECK(g.take_prefill_stats().hit_tokens == 0);
  // No hit: the very pass a generator without cache runs, so the very bits.
  generator plain(next);
  const auto ref = run_one(plain, prompt, sampled(8, 6));
  CHECK(got.at(0).tokens == ref.at(0).tokens);
  CHECK(same_bits(got.at(0).logprobs, ref.at(0).logprobs));
  CHECK_THROWS_AS(generator(m, with_prefix_cache(-1)), std::invalid_argument);
}
