#include "actors/sync/delta_receiver.hpp"

#include <algorithm>
#include <stdexcept>
#include <variant>

#include <fmt/format.h>

namespace sorl::sync {

void delta_receiver::reset() {
  active_ = false;
  header_.clear();
  buckets_.clear();
  count_ = 0;
  left_ = 0;
  changed_ = 0;
}

std::optional<std::string> delta_receiver::begin(uint64_t version, uint64_t base_version,
                                                 std::optional<uint64_t> held,
                                                 const std::vector<tensor_meta>& header,
                                                 uint64_t header_model_hash,
                                                 uint32_t bucket_count,
                                                 const std::vector<tensor_meta>& expected) {
  reset();
  if (!held)
    return fmt::format("delta {} → {} arrived, but this worker holds no known version",
                       base_version, version);
  if (*held != base_version)
    return fmt::format("delta {} → {} arrived, but this worker holds version {}", base_version,
                       version, *held);
  if (auto err = match_header(version, header, expected))
    return err;
  for (const auto& h : header)
    if (h.dtype != weight_dtype::bf16)
      return fmt::format("version {} tensor \"{}\": sparse deltas carry bf16 only", version,
                         h.name);
  if (bucket_count == 0)
    return fmt::format("sparse version {} announces no buckets", version);
  uint64_t elements = 0;
  for (const auto& h : header)
    elements += h.elements();
  if (bucket_count > std::max<uint64_t>(1, elements))
    return fmt::format("sparse version {} announces {} buckets for {} elements", version,
                       bucket_count, elements);
  header_ = header;
  version_ = version;
  base_version_ = base_version;
  model_hash_ = header_model_hash;
  count_ = bucket_count;
  left_ = bucket_count;
  active_ = true;
  return std::nullopt;
}

std::optional<std::string> delta_receiver::add_bucket(uint64_t version, uint32_t index,
                                                      const uint8_t* data, size_t size,
                                                      const std::vector<delta_target>& targets) {
  if (!active_)
    return fmt::format("delta bucket {} of version {} without a version header", index,
                       version);
  if (version != version_)
    return fmt::format("delta bucket of version {} while receiving version {}", version,
                       version_);
  if (index >= count_)
    return fmt::format("delta bucket index {} out of range [0, {})", index, count_);
  if (buckets_.count(index) != 0)
    return fmt::format("delta bucket {} received twice", index);
  auto info = read_delta_bucket_info(data, size);
  if (auto* err = std::get_if<std::string>(&info))
    return fmt::format("delta bucket {}: {}", index, *err);
  const auto& h = std::get<delta_bucket_info>(info);
  if (h.index != index || h.count != count_)
    return fmt::format("delta bucket {} of {} says it is bucket {} of {}", index, count_,
                       h.index, h.count);
  if (auto err = check_delta_bucket(data, size, base_version_, version_, targets))
    return fmt::format("delta bucket {}: {}", index, *err);
  buckets_[index].assign(data, data + size);
  --left_;
  changed_ += h.changed;
  return std::nullopt;
}

bool delta_receiver::complete() const {
  return active_ && left_ == 0;
}

std::optional<std::string> delta_receiver::apply(const std::vector<delta_target>& targets,
                                                 uint64_t* computed_model_hash) {
  if (!complete())
    throw std::logic_error(fmt::format("delta_receiver::apply: version {} has {} bucket(s) "
                                       "missing",
                                       version_, left_));
  if (targets.size() != header_.size())
    throw std::logic_error(fmt::format("delta_receiver::apply: {} targets for {} tensors",
                                       targets.size(), header_.size()));
  // Every bucket was checked by check_delta_bucket on arrival (receive), so the validating
  // decode pass is skipped here.
  for (const auto& [k, bytes] : buckets_)
    if (auto err = apply_checked_delta_bucket(bytes.data(), bytes.size(), base_version_,
                                              version_, targets))
      return fmt::format("delta bucket {}: {}", k, *err); // checked on arrival: not expected
  std::vector<uint64_t> hashes(header_.size());
  std::optional<std::string> first_bad;
  for (size_t i = 0; i < header_.size(); ++i) {
    const auto& t = targets[i];
    hashes[i] = hash_bytes(t.bits, t.elements * sizeof(uint16_t));
    if (hashes[i] != header_[i].hash && !first_bad)
      first_bad = fmt::format("tensor \"{}\": hash {:016x} after the delta, published {:016x}",
                              header_[i].name, hashes[i], header_[i].hash);
  }
  auto mh = model_hash(hashes);
  if (computed_model_hash)
    *computed_model_hash = mh;
  if (first_bad)
    return first_bad;
  if (mh != model_hash_)
    return fmt::format("model hash {:016x} after the delta, published {:016x}", mh,
                       model_hash_);
  return std::nullopt;
}

} // namespace sorl::sync
