// A tied embedding / LM head is synced once (it is one parameter) and stays tied: after many
// sparse versions applied by raw writes into the rollout copy, the logits equal those of a
// rollout copy taken from the publisher's weights directly.

#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "actors/sync/delta_receiver.hpp"
#include "runtime/ml/policy/model.hpp"

using namespace sorl;

namespace {

std::vector<uint16_t> bits_of(const at::Tensor& bf16) {
  auto c = bf16.contiguous();
  auto p = static_cast<const uint16_t*>(c.data_ptr());
  return {p, p + c.numel()};
}

} // namespace

TEST_CASE("a tied embedding and LM head stay identical after many sparse versions") {
  at::set_num_threads(1);
  c10::InferenceMode guard;
  ml::model_dims dims;
  dims.d_model = 32;
  dims.n_layers = 1;
  dims.n_heads = 2;
  dims.n_kv_heads = 1;
  dims.d_ff = 64;
  dims.max_seq = 16;
  REQUIRE(dims.tie_embeddings);
  ml::policy_model learner{dims, 7};
  auto worker = learner.clone(at::kBFloat16);
  CHECK_THROWS_AS(worker.parameter("lm_head.weight"), std::out_of_range); // listed once
  std::vector<sync::tensor_meta> expected;
  std::vector<sync::delta_target> targets;
  for (const auto& [name, t] : worker.parameters()) {
    sync::tensor_meta m;
    m.name = name;
    m.shape.assign(t.sizes().begin(), t.sizes().end());
    expected.push_back(m);
    targets.push_back({static_cast<uint32_t>(targets.size()),
                       static_cast<uint16_t*>(t.data_ptr()), static_cast<uint64_t>(t.numel())});
  }
  auto published = learner.clone(at::kBFloat16);
  for (uint64_t v = 1; v <= 12; ++v) {
    // An optimizer-like nudge of the fp32 master weights, embedding included.
    at::manual_seed(v);
    for (const auto& [name, t] : learner.parameters())
      t.add_(at::randn_like(t) * 1e-3);
    auto next = learner.clone(at::kBFloat16);
    std::vector<std::vector<uint16_t>> old_bits, new_bits;
    std::vector<sync::delta_source> sources;
    std::vector<sync::tensor_meta> header = expected;
    std::vector<uint64_t> hashes;
    for (size_t i = 0; i < expected.size(); ++i) {
      old_bits.push_back(bits_of(published.parameters()[i].second));
      new_bits.push_back(bits_of(next.parameters()[i].second));
      header[i].hash = sync::hash_bytes(new_bits[i].data(), new_bits[i].size() * 2);
      hashes.push_back(header[i].hash);
    }
    for (size_t i = 0; i < expected.size(); ++i)
      sources.push_back({static_cast<uint32_t>(i), old_bits[i].data(), new_bits[i].data(),
                         old_bits[i].size()});
    auto buckets = sync::encode_delta(v - 1, v, sources, {});
    sync::delta_receiver r;
    REQUIRE_FALSE(r.begin(v, v - 1, v - 1, header, sync::model_hash(hashes),
                          static_cast<uint32_t>(buckets.size()), expected));
    for (size_t k = 0; k < buckets.size(); ++k)
      REQUIRE_FALSE(r.add_bucket(v, static_cast<uint32_t>(k), buckets[k].data(),
                                 buckets[k].size(), targets));
    uint64_t hash = 0;
    REQUIRE_FALSE(r.apply(targets, &hash));
    worker.refresh_compute_weights();
    published = std::move(next);
  }
  // The rollout copy after 12 deltas computes exactly what a fresh copy of the learner does.
  auto fresh = learner.clone(at::kBFloat16);
  auto ids = at::arange(1, 9, at::kLong).reshape({1, 8});
  auto a = worker.forward(ids);
  auto b = fresh.forward(ids);
  CHECK(at::equal(a, b));
  CHECK(at::equal(worker.parameter("model.embed_tokens.weight"),
                  fresh.parameter("model.embed_tokens.weight")));
}
