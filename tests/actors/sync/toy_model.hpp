#pragma once

// A small bf16 model for the sync tests (its bits, metas, hashes and delta targets) and a
// rollout worker's weight receiver over it.

#include <cstdint>
#include <string>
#include <vector>

#include "actors/sync/weight_receiver.hpp"
#include "actors/sync/weight_sync.hpp"
#include "runtime/sync/delta_codec.hpp"

namespace sorl::sync::test {

/// A model's bf16 bits, tensor i named "t<i>" of shape {size}.
struct toy_model {
  std::vector<std::vector<uint16_t>> tensors;

  std::vector<tensor_meta> metas() const {
    std::vector<tensor_meta> out;
    for (size_t i = 0; i < tensors.size(); ++i) {
      tensor_meta m;
      m.name = "t" + std::to_string(i);
      m.shape = {static_cast<int64_t>(tensors[i].size())};
      m.hash = hash_bytes(tensors[i].data(), tensors[i].size() * 2);
      out.push_back(m);
    }
    return out;
  }
  uint64_t hash() const {
    std::vector<uint64_t> h;
    for (const auto& m : metas())
      h.push_back(m.hash);
    return model_hash(h);
  }
  std::vector<delta_target> targets() {
    std::vector<delta_target> out;
    for (size_t i = 0; i < tensors.size(); ++i)
      out.push_back({static_cast<uint32_t>(i), tensors[i].data(), tensors[i].size()});
    return out;
  }
};

/// Tensors of `sizes` elements, element j of tensor i = seed + 1000 i + 3 j.
inline toy_model make_model(std::vector<size_t> sizes, uint16_t seed) {
  toy_model m;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint16_t> t(sizes[i]);
    for (size_t j = 0; j < t.size(); ++j)
      t[j] = static_cast<uint16_t>(seed + 1000 * i + 3 * j);
    m.tensors.push_back(std::move(t));
  }
  return m;
}

/// `m` with every `every`-th element moved up by one ULP.
inline toy_model nudged(const toy_model& m, size_t every) {
  auto out = m;
  for (auto& t : out.tensors)
    for (size_t j = 0; j < t.size(); j += every)
      ++t[j];
  return out;
}

/// A rollout worker: its model's bits, a settable clock and the receiver under test.
struct worker {
  toy_model model;
  int64_t now = 0;
  weight_receiver receiver;

  explicit worker(toy_model m, std::string name = "w")
      : model(std::move(m)),
        receiver(std::move(name), model.metas(), model.targets(), [this] { return now; }) {}
};

} // namespace sorl::sync::test
