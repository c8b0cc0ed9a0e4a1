#include "actors/sync/weight_sync.hpp"

#include <cstring>
#include <stdexcept>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>

namespace sorl::sync {

size_t element_size(weight_dtype d) {
  return d == weight_dtype::bf16 ? 2 : 4;
}

uint64_t hash_bytes(const void* data, size_t n) {
  return XXH3_64bits(data, n);
}

uint64_t model_hash(const std::vector<uint64_t>& tensor_hashes) {
  return XXH3_64bits(tensor_hashes.data(), tensor_hashes.size() * sizeof(uint64_t));
}

uint64_t tensor_meta::elements() const {
  uint64_t n = 1;
  for (auto d : shape)
    n *= static_cast<uint64_t>(d);
  return n;
}

std::vector<std::vector<chunk_ref>> plan_buckets(const std::vector<tensor_meta>& tensors,
                                                 uint64_t bucket_bytes) {
  std::vector<std::vector<chunk_ref>> buckets;
  std::vector<chunk_ref> current;
  uint64_t used = 0;
  for (uint32_t t = 0; t < tensors.size(); ++t) {
    auto esz = element_size(tensors[t].dtype);
    if (bucket_bytes < esz)
      throw std::invalid_argument(
        fmt::format("plan_buckets: bucket_bytes = {} is below one element", bucket_bytes));
    uint64_t left = tensors[t].elements();
    uint64_t offset = 0;
    while (left > 0) {
      uint64_t room = (bucket_bytes - used) / esz;
      if (room == 0) {
        buckets.push_back(std::move(current));
        current.clear();
        used = 0;
        continue;
      }
      uint64_t take = std::min(room, left);
      current.push_back({t, offset, take});
      used += take * esz;
      offset += take;
      left -= take;
    }
  }
  if (!current.empty())
    buckets.push_back(std::move(current));
  return buckets;
}

std::optional<std::string> match_header(uint64_t version, const std::vector<tensor_meta>& header,
                                        const std::vector<tensor_meta>& expected) {
  if (header.size() != expected.size())
    return fmt::format("version {} has {} tensors, the model has {}", version, header.size(),
                       expected.size());
  for (size_t i = 0; i < header.size(); ++i) {
    const auto& h = header[i];
    const auto& e = expected[i];
    if (h.name != e.name || h.shape != e.shape || h.dtype != e.dtype)
      return fmt::format("version {} tensor {} is \"{}\" {}, the model expects \"{}\" {}",
                         version, i, h.name, fmt::join(h.shape, "x"), e.name,
                         fmt::join(e.shape, "x"));
  }
  return std::nullopt;
}

void weight_assembler::reset() {
  active_ = false;
  header_.clear();
  staging_.clear();
  filled_.clear();
  bucket_seen_.clear();
  buckets_left_ = 0;
}

std::optional<std::string> weight_assembler::begin(uint64_t version,
                                                   const std::vector<tensor_meta>& header,
                                                   uint64_t header_model_hash,
                                                   uint32_t bucket_count,
                                                   const std::vector<tensor_meta>& expected) {
  reset();
  if (auto err = match_header(version, header, expected))
    return err;
  uint64_t total = 0, elements = 0;
  for (const auto& h : header) {
    total += h.bytes();
    elements += h.elements();
  }
  if (bucket_count == 0 && total > 0)
    return fmt::format("version {} announces no buckets for {} bytes", version, total);
  // Every bucket carries at least one element (plan_buckets): a larger count is hostile, and
  // would otherwise size bucket_seen_.
  if (bucket_count > elements)
    return fmt::format("version {} announces {} buckets for {} elements", version, bucket_count,
                       elements);
  header_ = header;
  version_ = version;
  model_hash_ = header_model_hash;
  staging_.resize(header.size());
  for (size_t i = 0; i < header.size(); ++i)
    staging_[i].assign(header[i].bytes(), 0);
  filled_.assign(header.size(), 0);
  bucket_seen_.assign(bucket_count, false);
  buckets_left_ = bucket_count;
  active_ = true;
  return std::nullopt;
}

std::optional<std::string> weight_assembler::add_bucket(uint64_t version, uint32_t index,
                                                        const std::vector<chunk_view>& chunks,
                                                        uint64_t checksum) {
  if (!active_)
    return fmt::format("bucket {} of version {} without a version header", index, version);
  if (version != version_)
    return fmt::format("bucket of version {} while assembling version {}", version, version_);
  if (index >= bucket_seen_.size())
    return fmt::format("bucket index {} out of range [0, {})", index, bucket_seen_.size());
  if (bucket_seen_[index])
    return fmt::format("bucket {} received twice", index);
  // Validate everything first; copy only when the whole bucket is sound.
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (const auto& c : chunks) {
    if (c.tensor >= header_.size())
      return fmt::format("bucket {}: tensor id {} out of range [0, {})", index, c.tensor,
                         header_.size());
    const auto& meta = header_[c.tensor];
    auto esz = element_size(meta.dtype);
    if (c.bytes % esz != 0)
      return fmt::format("bucket {}: {} bytes for tensor \"{}\" is not whole elements", index,
                         c.bytes, meta.name);
    uint64_t n = meta.elements();
    uint64_t count = c.bytes / esz;
    if (c.offset > n || count > n - c.offset)
      return fmt::format("bucket {}: elements [{}, {}) outside tensor \"{}\" of {} elements",
                         index, c.offset, c.offset + count, meta.name, n);
    XXH3_64bits_update(&state, c.data, c.bytes);
  }
  if (XXH3_64bits_digest(&state) != checksum)
    return fmt::format("bucket {}: checksum mismatch", index);
  for (const auto& c : chunks) {
    auto esz = element_size(header_[c.tensor].dtype);
    std::memcpy(staging_[c.tensor].data() + c.offset * esz, c.data, c.bytes);
    filled_[c.tensor] += c.bytes;
  }
  bucket_seen_[index] = true;
  --buckets_left_;
  return std::nullopt;
}

bool weight_assembler::complete() const {
  return active_ && buckets_left_ == 0;
}

std::optional<std::string> weight_assembler::verify(uint64_t* computed_model_hash) {
  if (!complete())
    return fmt::format("version {}: {} buckets still missing", version_, buckets_left_);
  std::vector<uint64_t> hashes(header_.size());
  for (size_t i = 0; i < header_.size(); ++i) {
    if (filled_[i] != header_[i].bytes())
      return fmt::format("tensor \"{}\": {} of {} bytes received", header_[i].name, filled_[i],
                         header_[i].bytes());
    hashes[i] = hash_bytes(staging_[i].data(), staging_[i].size());
    if (hashes[i] != header_[i].hash)
      return fmt::format("tensor \"{}\": hash {:016x}, header says {:016x}", header_[i].name,
                         hashes[i], header_[i].hash);
  }
  auto mh = model_hash(hashes);
  if (computed_model_hash)
    *computed_model_hash = mh;
  if (mh != model_hash_)
    return fmt::format("model hash {:016x}, header says {:016x}", mh, model_hash_);
  return std::nullopt;
}

} // namespace sorl::sync
