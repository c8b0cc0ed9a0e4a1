#include "actors/suffix_index/suffix_wire.hpp"

#include <stdexcept>

namespace sorl::suffix_index {

namespace {

// Cap'n Proto list sizes are 29-bit element counts.
constexpr std::size_t max_list = (std::size_t{1} << 29) - 1;

unsigned list_size(std::size_t n) {
  if (n > max_list)
    throw std::length_error("SuffixResponses: a list of " + std::to_string(n) +
                            " elements does not fit a Cap'n Proto list");
  return static_cast<unsigned>(n);
}

} // namespace

envelope to_msg(const suffix_responses& m) {
  return build_envelope<msg::SuffixResponses>([&](msg::SuffixResponses::Builder b) {
    b.setOrigin(m.origin);
    auto outer = b.initResponses(list_size(m.responses.size()));
    for (std::size_t i = 0; i < m.responses.size(); ++i) {
      const auto& r = m.responses[i];
      auto inner = outer.init(static_cast<unsigned>(i), list_size(r.size()));
      for (std::size_t j = 0; j < r.size(); ++j)
        inner.set(static_cast<unsigned>(j), r[j]);
    }
  });
}

suffix_responses from_msg(msg::SuffixResponses::Reader r) {
  suffix_responses out;
  out.origin = r.getOrigin();
  const auto outer = r.getResponses();
  out.responses.reserve(outer.size());
  for (const auto inner : outer) {
    auto& dst = out.responses.emplace_back();
    dst.reserve(inner.size());
    for (const std::int32_t t : inner)
      dst.push_back(t);
  }
  return out;
}

} // namespace sorl::suffix_index
