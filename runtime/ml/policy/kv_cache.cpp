#include "runtime/ml/policy/kv_cache.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_set>

namespace sorl::ml {

namespace {
// Block 0 is never handed out and stays zero: padded gathers read it, so masked keys are
// finite whatever the sequences hold (0 * NaN would leak through the softmax otherwise).
constexpr std::int32_t null_block = 0;
}  // namespace

kv_cache::kv_cache(const model_dims& dims, kv_cache_options opts, c10::Device device,
                   c10::ScalarType dtype)
    : dims_(dims), opts_(opts) {
  dims.validate();
  if (opts.block_size <= 0 || opts.initial_blocks <= 0 || opts.max_blocks < 0)
    throw std::invalid_argument(fmt::format(
        "kv_cache_options: block_size ({}) and initial_blocks ({}) must be > 0, max_blocks ({}) >= 0",
        opts.block_size, opts.initial_blocks, opts.max_blocks));
  if (opts.max_blocks > 0 && opts.initial_blocks > opts.max_blocks)
    throw std::invalid_argument(fmt::format("kv_cache_options: initial_blocks ({}) > max_blocks ({})",
                                            opts.initial_blocks, opts.max_blocks));
  capacity_ = opts.initial_blocks + 1;
  pool_ = at::zeros({dims.n_layers, 2, capacity_ * opts.block_size, dims.n_kv_heads * dims.head_dim()},
                    at::TensorOptions().dtype(dtype).device(device));
  refcount_.assign(static_cast<std::size_t>(capacity_), 0);
  refcount_[null_block] = 1;
  for (std::int64_t b = capacity_ - 1; b >= 1; --b) free_.push_back(static_cast<std::int32_t>(b));
}

c10::Device kv_cache::device() const noexcept { return pool_.device(); }
c10::ScalarType kv_cache::dtype() const noexcept { return pool_.scalar_type(); }

kv_cache::sequence& kv_cache::find(seq_id s) {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) throw std::out_of_range(fmt::format("kv_cache: unknown sequence {}", s));
  return it->second;
}

const kv_cache::sequence& kv_cache::find(seq_id s) const {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) throw std::out_of_range(fmt::format("kv_cache: unknown sequence {}", s));
  return it->second;
}

bool kv_cache::contains(seq_id s) const noexcept { return seqs_.count(s) != 0; }
std::int64_t kv_cache::length(seq_id s) const { return find(s).length; }

std::int64_t kv_cache::blocks_in_use() const noexcept {
  return capacity_ - 1 - static_cast<std::int64_t>(free_.size());
}

seq_id kv_cache::create() {
  const seq_id id = next_id_++;
  seqs_.emplace(id, sequence{});
  return id;
}

seq_id kv_cache::fork(seq_id parent) {
  const sequence copy = find(parent);
  for (const std::int32_t b : copy.blocks) ++refcount_[static_cast<std::size_t>(b)];
  const seq_id id = next_id_++;
  seqs_.emplace(id, copy);
  return id;
}

void kv_cache::drop_block(std::int32_t block) {
  auto& rc = refcount_[static_cast<std::size_t>(block)];
  TORCH_INTERNAL_ASSERT(rc > 0 && block != null_block, "kv_cache: block ", block,
                        " dropped with refcount ", rc);
  if (--rc == 0) free_.push_back(block);
}

std::int32_t kv_cache::allocate_block() {
  TORCH_INTERNAL_ASSERT(!free_.empty(), "kv_cache: allocate_block without capacity");
  const std::int32_t b = free_.back();
  free_.pop_back();
  refcount_[static_cast<std::size_t>(b)] = 1;
  return b;
}

void kv_cache::truncate(seq_id s, std::int64_t length) {
  sequence& seq = find(s);
  if (length < 0 || length > seq.length)
    throw std::out_of_range(fmt::format("kv_cache::truncate: length {} outside [0, {}] of sequence {}",
                                        length, seq.length, s));
  const auto keep = static_cast<std::size_t>((length + opts_.block_size - 1) / opts_.block_size);
  while (seq.blocks.size() > keep) {
    drop_block(seq.blocks.back());
    seq.blocks.pop_back();
  }
  seq.length = length;
}

void kv_cache::release(seq_id s) {
  sequence& seq = find(s);
  for (const std::int32_t b : seq.blocks) drop_block(b);
  seqs_.erase(s);
}

seq_id kv_cache::adopt(const std::vector<std::int32_t>& blocks, std::int64_t length) {
  const auto n = static_cast<std::int64_t>(blocks.size());
  if (length <= (n - 1) * opts_.block_size || length > n * opts_.block_size)
    throw std::invalid_argument(fmt::format("kv_cache::adopt: {} positions do not fill {} blocks of {}",
                                            length, n, opts_.block_size));
  for (const std::int32_t b : blocks) check_allocated(b, "kv_cache::adopt");
  for (const std::int32_t b : blocks) ++refcount_[static_cast<std::size_t>(b)];
  const seq_id id = next_id_++;
  seqs_.emplace(id, sequence{blocks, length});
  return id;
}

const std::vector<std::int32_t>& kv_cache::blocks(seq_id s) const { return find(s).blocks; }

void kv_cache::check_allocated(std::int32_t block, const char* what) const {
  if (block == null_block || block < 0 || block >= capacity_ || refcount_[static_cast<std::size_t>(block)] == 0)
    throw std::out_of_range(fmt::format("{}: block {} is not allocated", what, block));
}

void kv_cache::retain(std::int32_t block) {
  check_allocated(block, "kv_cache::retain");
  ++refcount_[static_cast<std::size_t>(block)];
}

void kv_cache::drop(std::int32_t block) {
  check_allocated(block, "kv_cache::drop");
  drop_block(block);
}

std::int32_t kv_cache::refcount(std::int32_t block) const {
  if (block < 0 || block >= capacity_)
    throw std::out_of_range(fmt::format("kv_cache::refcount: block {} outside [0, {})", block, capacity_));
  return block == null_block ? 0 : refcount_[static_cast<std::size_t>(block)];
}

void kv_cache::grow(std::int64_t min_capacity) {
  std::int64_t cap = std::max(min_capacity, 2 * capacity_);
  if (opts_.max_blocks > 0) cap = std::min(cap, opts_.max_blocks + 1);
  TORCH_INTERNAL_ASSERT(cap >= min_capacity, "kv_cache: grow below the requested capacity");
  const std::int64_t bs = opts_.block_size;
  at::Tensor bigger = at::zeros({pool_.size(0), 2, cap * bs, pool_.size(3)}, pool_.options());
  bigger.narrow(2, 0, capacity_ * bs).copy_(pool_);
  pool_ = bigger;
  refcount_.resize(static_cast<std::size_t>(cap), 0);
  // Hand out the new blocks lowest first, after the already free ones.
  std::vector<std::int32_t> fresh;
  for (std::int64_t b = cap - 1; b >= capacity_; --b) fresh.push_back(static_cast<std::int32_t>(b));
  free_.insert(free_.begin(), fresh.begin(), fresh.end());
  capacity_ = cap;
}

kv_append_plan kv_cache::plan_append(const std::vector<seq_id>& seqs,
                                     const std::vector<std::int64_t>& counts) {
  TORCH_CHECK(seqs.size() == counts.size(), "plan_append: ", seqs.size(), " sequences but ",
              counts.size(), " counts");
  TORCH_CHECK(!seqs.empty(), "plan_append: no sequences");
  const std::int64_t bs = opts_.block_size;

  // Validate everything and count blocks before touching any state (strong guarantee).
  std::unordered_set<seq_id> seen;
  std::int64_t blocks_needed = 0;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    TORCH_CHECK(seen.insert(seqs[i]).second, "plan_append: sequence ", seqs[i], " appears twice");
    auto it = seqs_.find(seqs[i]);
    TORCH_CHECK(it != seqs_.end(), "plan_append: unknown sequence ", seqs[i]);
    const sequence& s = it->second;
    TORCH_CHECK(counts[i] >= 1, "plan_append: sequence ", seqs[i], " appends ", counts[i],
                " tokens; need >= 1");
    TORCH_CHECK(s.length + counts[i] <= dims_.max_seq, "plan_append: sequence ", seqs[i],
                " of length ", s.length, " + ", counts[i], " new tokens exceeds max_seq ",
                dims_.max_seq);
    const std::int64_t have = static_cast<std::int64_t>(s.blocks.size());
    blocks_needed += (s.length + counts[i] + bs - 1) / bs - have;
    if (s.length % bs != 0 && refcount_[static_cast<std::size_t>(s.blocks.back())] > 1)
      ++blocks_needed;  // copy-on-write of the shared partial block (an upper bound)
  }
  const auto free_now = static_cast<std::int64_t>(free_.size());
  if (blocks_needed > free_now) {
    const std::int64_t want = capacity_ + (blocks_needed - free_now);
    TORCH_CHECK(opts_.max_blocks == 0 || want <= opts_.max_blocks + 1, "kv_cache: out of blocks: ",
                blocks_needed, " needed, ", free_now, " free, limit max_blocks = ", opts_.max_blocks);
    grow(want);
  }

  kv_append_plan plan;
  plan.batch = static_cast<std::int64_t>(seqs.size());
  plan.seqs = seqs;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    sequence& s = seqs_.at(seqs[i]);
    plan.old_lengths.push_back(s.length);
    if (s.length % bs != 0) {
      const std::int32_t shared = s.blocks.back();
      if (refcount_[static_cast<std::size_t>(shared)] > 1) {
        const std::int32_t own = allocate_block();
        pool_.narrow(2, own * bs, bs).copy_(pool_.narrow(2, shared * bs, bs));
        drop_block(shared);
        s.blocks.back() = own;
      }
    }
    const std::int64_t new_len = s.length + counts[i];
    while (static_cast<std::int64_t>(s.blocks.size()) * bs < new_len) s.blocks.push_back(allocate_block());
    s.length = new_len;
    plan.total_new += counts[i];
    plan.max_new = std::max(plan.max_new, counts[i]);
    plan.max_len = std::max(plan.max_len, new_len);
  }

  const std::int64_t B = plan.batch, N = plan.total_new, K = plan.max_new, S = plan.max_len;
  const auto lopts = at::TensorOptions().dtype(at::kLong);
  at::Tensor write_slots = at::empty({N}, lopts);
  at::Tensor positions = at::empty({N}, lopts);
  at::Tensor gather = at::empty({B * S}, lopts);
  at::Tensor masked = at::empty({B, K, S}, lopts.dtype(at::kBool));
  at::Tensor pad_rows = at::empty({B * K}, lopts);
  at::Tensor unpad_rows = at::empty({N}, lopts);
  at::Tensor last_rows = at::empty({B}, lopts);
  auto* ws = write_slots.data_ptr<std::int64_t>();
  auto* pos = positions.data_ptr<std::int64_t>();
  auto* g = gather.data_ptr<std::int64_t>();
  auto* mk = masked.data_ptr<bool>();
  auto* pr = pad_rows.data_ptr<std::int64_t>();
  auto* ur = unpad_rows.data_ptr<std::int64_t>();
  auto* lr = last_rows.data_ptr<std::int64_t>();
  std::int64_t row = 0;
  for (std::int64_t i = 0; i < B; ++i) {
    const sequence& s = seqs_.at(seqs[static_cast<std::size_t>(i)]);
    const std::int64_t L0 = plan.old_lengths[static_cast<std::size_t>(i)];
    const std::int64_t k = counts[static_cast<std::size_t>(i)];
    auto slot = [&](std::int64_t p) { return s.blocks[static_cast<std::size_t>(p / bs)] * bs + p % bs; };
    for (std::int64_t j = 0; j < S; ++j) g[i * S + j] = j < s.length ? slot(j) : 0;
    for (std::int64_t t = 0; t < k; ++t) {
      ws[row + t] = slot(L0 + t);
      pos[row + t] = L0 + t;
      ur[row + t] = i * K + t;
    }
    for (std::int64_t t = 0; t < K; ++t) {
      // Padded queries (t >= k) repeat the last real one: their rows are dropped, and they
      // must not be fully masked (softmax of all -inf is NaN).
      const std::int64_t tt = std::min(t, k - 1);
      pr[i * K + t] = row + tt;
      const std::int64_t visible = L0 + tt + 1;  // causal: keys [0, position] inclusive
      for (std::int64_t j = 0; j < S; ++j) mk[(i * K + t) * S + j] = j >= visible;
    }
    lr[i] = row + k - 1;
    row += k;
  }
  const c10::Device dev = pool_.device();
  plan.write_slots = write_slots.to(dev);
  plan.positions = positions.to(dev);
  plan.gather_slots = gather.to(dev);
  plan.masked = masked.to(dev);
  if (K > 1) {
    plan.pad_rows = pad_rows.to(dev);
    plan.unpad_rows = unpad_rows.to(dev);
  }
  plan.last_rows = last_rows.to(dev);
  return plan;
}

void kv_cache::rollback(const kv_append_plan& plan) {
  for (std::size_t i = 0; i < plan.seqs.size(); ++i)
    if (contains(plan.seqs[i]) && length(plan.seqs[i]) >= plan.old_lengths[i])
      truncate(plan.seqs[i], plan.old_lengths[i]);
}

at::Tensor kv_cache::keys(std::int64_t layer) const {
  TORCH_CHECK(layer >= 0 && layer < dims_.n_layers, "kv_cache::keys: layer ", layer,
              " outside [0, ", dims_.n_layers, ")");
  return pool_.select(0, layer).select(0, 0);
}

at::Tensor kv_cache::values(std::int64_t layer) const {
  TORCH_CHECK(layer >= 0 && layer < dims_.n_layers, "kv_cache::values: layer ", layer,
              " outside [0, ", dims_.n_layers, ")");
  return pool_.select(0, layer).select(0, 1);
}

}  // namespace sorl::ml
