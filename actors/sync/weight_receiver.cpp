#include "actors/sync/weight_receiver.hpp"

#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace sorl::sync {

weight_receiver::weight_receiver(std::string name, std::vector<tensor_meta> expected,
                                 std::vector<delta_target> targets, clock_ns now)
    : name_(std::move(name)), expected_(std::move(expected)), targets_(std::move(targets)),
      now_(std::move(now)) {
  if (targets_.size() != expected_.size())
    throw std::invalid_argument(fmt::format("weight_receiver: {} targets for {} tensors",
                                            targets_.size(), expected_.size()));
  for (size_t i = 0; i < targets_.size(); ++i) {
    const auto& t = targets_[i];
    const auto& m = expected_[i];
    if (t.tensor != i || t.elements != m.elements() || m.dtype != weight_dtype::bf16 ||
        (t.elements > 0 && t.bits == nullptr))
      throw std::invalid_argument(fmt::format("weight_receiver: target {} does not hold the "
                                              "{} bf16 elements of tensor \"{}\"",
                                              i, m.elements(), m.name));
  }
  if (!now_)
    throw std::invalid_argument("weight_receiver: no clock");
}

void weight_receiver::acknowledge(result& r, uint64_t version, bool ok, uint64_t hash,
                                  const std::string& reason, bool full) {
  weight_ack a;
  a.version = version;
  a.ok = ok;
  a.model_hash = hash;
  a.reason = reason;
  a.apply_ns = now_() - version_started_ns_;
  a.full = full;
  if (!ok)
    r.logs.push_back({log_line::level::error,
                      fmt::format("{}: version {} not applied: {}", name_, version, reason)});
  r.ack = std::move(a);
}

weight_receiver::result weight_receiver::on_header(const version_header& h) {
  result r;
  version_started_ns_ = now_();
  pending_ = pending_apply::none;
  assembler_.reset();
  receiver_.reset();
  if (h.full) {
    if (auto err = assembler_.begin(h.version, h.tensors, h.model_hash, h.bucket_count,
                                    expected_))
      acknowledge(r, h.version, false, 0, *err, true);
    return r;
  }
  std::optional<uint64_t> held;
  if (version_ != no_version)
    held = version_;
  if (auto err = receiver_.begin(h.version, h.base_version, held, h.tensors, h.model_hash,
                                 h.bucket_count, expected_))
    acknowledge(r, h.version, false, 0, *err, false);
  return r;
}

weight_receiver::result weight_receiver::on_bucket(const bucket_view& b, bool idle) {
  if (b.delta != nullptr && b.delta_size > 0)
    return on_delta_bucket(b, idle);
  result r;
  if (auto err = assembler_.add_bucket(b.version, b.index, b.chunks, b.checksum)) {
    assembler_.reset();
    acknowledge(r, b.version, false, 0, *err, true);
    return r;
  }
  if (!assembler_.complete())
    return r;
  uint64_t hash = 0;
  if (auto err = assembler_.verify(&hash)) {
    assembler_.reset();
    acknowledge(r, b.version, false, hash, *err, true);
    return r;
  }
  pending_ = pending_apply::full;
  pending_hash_ = hash;
  return maybe_apply(idle);
}

weight_receiver::result weight_receiver::on_delta_bucket(const bucket_view& b, bool idle) {
  result r;
  if (auto err = receiver_.add_bucket(b.version, b.index, b.delta, b.delta_size, targets_)) {
    if (receiver_.active() && receiver_.version() == b.version) {
      receiver_.reset();
      acknowledge(r, b.version, false, 0, *err, false);
    } else {
      // A version already refused or abandoned.
      r.logs.push_back({log_line::level::warn, fmt::format("{}: {}", name_, *err)});
    }
    return r;
  }
  if (!receiver_.complete())
    return r;
  pending_ = pending_apply::delta;
  return maybe_apply(idle);
}

weight_receiver::result weight_receiver::on_idle() {
  return maybe_apply(true);
}

void weight_receiver::copy_full_version() {
  // The targets are contiguous bf16 like the staged bytes, so a byte copy writes exactly the
  // bits a same-dtype tensor copy would.
  for (size_t i = 0; i < targets_.size(); ++i) {
    const auto& bytes = assembler_.staged(i);
    if (bytes.size() != targets_[i].elements * sizeof(uint16_t))
      throw std::logic_error(fmt::format("weight_receiver: {} staged bytes for {} elements of "
                                         "tensor {}",
                                         bytes.size(), targets_[i].elements, i));
    if (!bytes.empty())
      std::memcpy(targets_[i].bits, bytes.data(), bytes.size());
  }
}

weight_receiver::result weight_receiver::maybe_apply(bool idle) {
  result r;
  if (pending_ == pending_apply::none || !idle)
    return r;
  auto kind = pending_;
  pending_ = pending_apply::none;
  if (kind == pending_apply::full) {
    copy_full_version();
    r.weights_changed = true;
    version_ = assembler_.version();
    assembler_.reset();
    acknowledge(r, version_, true, pending_hash_, "", true);
    return r;
  }
  auto version = receiver_.version();
  uint64_t hash = 0;
  auto err = receiver_.apply(targets_, &hash);
  receiver_.reset();
  r.weights_changed = true;
  if (err) {
    version_ = no_version; // the weights are now of unknown version until a full sync
    acknowledge(r, version, false, hash, *err, false);
    return r;
  }
  version_ = version;
  acknowledge(r, version, true, hash, "", false);
  return r;
}

} // namespace sorl::sync
