#include "runtime/ml/policy/generate.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace sorl::ml {

struct generator::request {
  std::uint64_t id = 0;
  std::vector<std::int32_t> prompt;
  sampling_params params;
  std::int64_t group_size = 1;
  std::vector<std::int64_t> streams;  // random stream (= result sample_index) of each sibling
  stop_checker stop;
  bool park = false;         // park each sample's KV at a normal finish
  seq_id base = -1;          // taken-over parked sequence until admission, else -1
  std::int64_t base_len = 0; // its cached tokens: the prompt's prefix not to prefill
  std::int64_t hit_len = 0;  // prefix-cache tokens at admission (no base)
  std::int64_t priority = 0; // kv_reuse::priority

  request(std::uint64_t id_, std::vector<std::int32_t> prompt_, const sampling_params& p,
          std::vector<std::int64_t> streams_, detokenize_fn detok)
      : id(id_), prompt(std::move(prompt_)), params(p),
        group_size(static_cast<std::int64_t>(streams_.size())), streams(std::move(streams_)),
        stop(p, std::move(detok)) {}
};

struct generator::sample {
  std::shared_ptr<request> req;
  std::int64_t index = 0;
  seq_id seq = -1;
  sampler_rng rng;
  std::vector<std::int32_t> tokens;
  std::vector<float> logprobs;
  bool drafting = false;       // started in the draft source
  std::int64_t cached = 0;     // prompt tokens it did not prefill (generation_result::cached_tokens)
  sample_speculation spec;     // what speculation did for it, returned with the result

  sample(std::shared_ptr<request> r, std::int64_t i, seq_id s)
      : req(std::move(r)), index(i), seq(s), rng(req->params.seed, static_cast<std::uint64_t>(i)) {}
};

generator::generator(const policy_model& model, generator_options opts)
    : model_(model), opts_(opts) {
  if (opts.max_batch < 1)
    throw std::invalid_argument(fmt::format("generator_options.max_batch must be >= 1, got {}", opts.max_batch));
  if (opts.drafts != nullptr && opts.max_draft_tokens < 1)
    throw std::invalid_argument(fmt::format("generator_options.max_draft_tokens must be >= 1, got {}",
                                            opts.max_draft_tokens));
  if (opts.separate_prefill_tokens < 2)
    throw std::invalid_argument(fmt::format("generator_options.separate_prefill_tokens must be >= 2, got {}",
                                            opts.separate_prefill_tokens));
  if (opts.prefix_cache_tokens < 0)
    throw std::invalid_argument(fmt::format("generator_options.prefix_cache_tokens must be >= 0, got {}",
                                            opts.prefix_cache_tokens));
  cache_ = std::make_unique<kv_cache>(model.dims(), opts.cache, model.device(), c10::kFloat);
  if (opts.prefix_cache_tokens > 0) prefix_ = std::make_unique<prefix_cache>(*cache_, opts.prefix_cache_tokens);
}

generator::~generator() = default;

std::int64_t generator::live_samples() const noexcept { return static_cast<std::int64_t>(live_.size()); }

std::vector<generator::sample_progress> generator::progress() const {
  std::vector<sample_progress> out;
  out.reserve(live_.size());
  for (const auto& s : live_)
    out.push_back({s->req->id, s->index, static_cast<std::int64_t>(s->tokens.size())});
  return out;
}
std::int64_t generator::queued_requests() const noexcept { return static_cast<std::int64_t>(queue_.size()); }
const kv_cache& generator::cache() const noexcept { return *cache_; }

std::uint64_t generator::submit(std::vector<std::int32_t> prompt, const sampling_params& params,
                                std::int64_t group_size, detokenize_fn detokenize, kv_reuse reuse) {
  if (group_size < 1 || group_size > opts_.max_batch)
    throw std::invalid_argument(fmt::format(
        "generator::submit: group_size {} outside [1, max_batch = {}]", group_size, opts_.max_batch));
  std::vector<std::int64_t> streams(static_cast<std::size_t>(group_size));
  for (std::int64_t i = 0; i < group_size; ++i) streams[static_cast<std::size_t>(i)] = i;
  return submit(std::move(prompt), params, std::move(streams), std::move(detokenize), reuse);
}

std::uint64_t generator::submit(std::vector<std::int32_t> prompt, const sampling_params& params,
                                std::vector<std::int64_t> streams, detokenize_fn detokenize,
                                kv_reuse reuse) {
  validate(params);
  const auto group_size = static_cast<std::int64_t>(streams.size());
  for (std::size_t i = 0; i < streams.size(); ++i) {
    if (streams[i] < 0)
      throw std::invalid_argument(fmt::format("generator::submit: stream {} is negative", streams[i]));
    for (std::size_t j = 0; j < i; ++j)
      if (streams[j] == streams[i])
        throw std::invalid_argument(fmt::format("generator::submit: stream {} given twice", streams[i]));
  }
  const model_dims& d = model_.dims();
  const auto n = static_cast<std::int64_t>(prompt.size());
  if (n < 1 || n >= d.max_seq)
    throw std::invalid_argument(
        fmt::format("generator::submit: prompt of {} tokens; need 1 <= size < max_seq ({})", n, d.max_seq));
  for (const std::int32_t t : prompt)
    if (t < 0 || t >= d.vocab)
      throw std::invalid_argument(
          fmt::format("generator::submit: prompt token {} outside [0, {})", t, d.vocab));
  if (group_size < 1 || group_size > opts_.max_batch)
    throw std::invalid_argument(fmt::format(
        "generator::submit: group_size {} outside [1, max_batch = {}]", group_size, opts_.max_batch));
  auto parked = parked_.end();
  if (reuse.from != 0) {
    parked = parked_.find(reuse.from);
    if (parked == parked_.end())
      throw std::invalid_argument(fmt::format(
          "generator::submit: KV handle {} is not parked (released, already continued, or never issued)", reuse.from));
    const std::vector<std::int32_t>& cached = parked->second.tokens;
    const auto m = static_cast<std::int64_t>(cached.size());
    if (m >= n)
      throw std::invalid_argument(fmt::format(
          "generator::submit: parked KV {} caches {} tokens; the prompt of {} tokens must extend it by at least one",
          reuse.from, m, n));
    const auto diff = std::mismatch(cached.begin(), cached.end(), prompt.begin());
    if (diff.first != cached.end()) {
      const auto at = diff.first - cached.begin();
      throw std::invalid_argument(fmt::format(
          "generator::submit: parked KV {} ({} tokens) is not a prefix of the prompt ({} tokens): position {} "
          "holds token {} there and {} in the prompt",
          reuse.from, m, n, at, *diff.first, *diff.second));
    }
  }
  const std::uint64_t id = next_request_++;
  auto r = std::make_shared<request>(id, std::move(prompt), params, std::move(streams), std::move(detokenize));
  r->park = reuse.park;
  r->priority = reuse.priority;
  if (parked != parked_.end()) {
    r->base = parked->second.seq;
    r->base_len = static_cast<std::int64_t>(parked->second.tokens.size());
    parked_.erase(parked);
  }
  // Behind every queued request of at least its priority: FIFO among equals.
  const auto at = std::find_if(queue_.begin(), queue_.end(),
                               [&](const std::shared_ptr<request>& q) { return q->priority < r->priority; });
  queue_.insert(at, std::move(r));
  return id;
}

bool generator::release(parked_kv handle) {
  const auto it = parked_.find(handle);
  if (it == parked_.end()) return false;
  cache_->release(it->second.seq);
  parked_.erase(it);
  return true;
}

void generator::release_all_parked() {
  for (const auto& [handle, p] : parked_) cache_->release(p.seq);
  parked_.clear();
}

std::int64_t generator::parked_count() const noexcept { return static_cast<std::int64_t>(parked_.size()); }

void generator::set_weights_version(std::uint64_t version) {
  release_all_parked();
  if (prefix_) prefix_->set_version(version);
}

prefill_stats generator::take_prefill_stats() noexcept {
  prefill_stats out = prefill_;
  if (prefix_) {
    const prefix_cache_stats p = prefix_->take_stats();
    out.evicted_blocks = p.evicted_blocks;
    out.invalidated_blocks = p.invalidated_blocks;
    out.cached_blocks = prefix_->cached_blocks();
  }
  prefill_ = prefill_stats{};
  return out;
}

void generator::drop_request_kv(request& r) {
  if (r.base >= 0 && cache_->contains(r.base)) cache_->release(r.base);
  r.base = -1;
}

generation_result generator::finish(sample& s, finish_reason reason) {
  generation_result r;
  if (s.seq >= 0 && cache_->contains(s.seq)) {
    if (prefix_ && !s.req->park && reason != finish_reason::abort && !s.tokens.empty()) {
      // What the sequence caches (every token but the last) is a prefix the next turn of a
      // chat, or another prompt, may start with. A parked turn is left out: its episode
      // continues from the parked KV, no other request starts with its private chat, and
      // each turn re-inserting the whole chat filled the tree with leaves nobody reads, which
      // evicted the shared prompts (docs/war.md, "Prefix KV cache").
      std::vector<std::int32_t> text = s.req->prompt;
      text.insert(text.end(), s.tokens.begin(), s.tokens.end() - 1);
      prefix_->insert(text, std::min<std::int64_t>(cache_->length(s.seq), static_cast<std::int64_t>(text.size())),
                      s.seq);
    }
    if (s.req->park && reason != finish_reason::abort && !s.tokens.empty()) {
      // The last sampled token was never fed: the sequence caches everything before it.
      parked_seq p{s.seq, s.req->prompt};
      p.tokens.insert(p.tokens.end(), s.tokens.begin(), s.tokens.end() - 1);
      r.parked = next_parked_++;
      parked_.emplace(r.parked, std::move(p));
    } else {
      cache_->release(s.seq);
    }
  }
  s.seq = -1;
  if (s.drafting) {
    opts_.drafts->finish(s.req->id, s.index, reason != finish_reason::abort);
    s.drafting = false;
  }
  r.speculation = s.spec;
  r.request_id = s.req->id;
  r.sample_index = s.index;
  r.prompt_tokens = static_cast<std::int64_t>(s.req->prompt.size());
  r.cached_tokens = s.cached;
  r.tokens = std::move(s.tokens);
  r.logprobs = std::move(s.logprobs);
  r.reason = reason;
  return r;
}

bool generator::shares_uncached_prefill(const request& r, const std::vector<std::shared_ptr<request>>& admitted,
                                        std::vector<std::int32_t>& scratch) const {
  if (!prefix_ || !opts_.defer_shared_prefill || r.base >= 0 || admitted.empty()) return false;
  const std::int64_t block = opts_.cache.block_size;
  const auto limit = static_cast<std::int64_t>(r.prompt.size()) - 1;
  std::int64_t shared = 0;  // whole blocks in common with a prompt prefilled in this pass
  for (const auto& a : admitted) {
    if (a->base >= 0) continue;
    const auto n = std::min<std::int64_t>(limit, static_cast<std::int64_t>(a->prompt.size()) - 1);
    const auto diff = std::mismatch(r.prompt.begin(), r.prompt.begin() + n, a->prompt.begin());
    shared = std::max<std::int64_t>(shared, (diff.first - r.prompt.begin()) / block * block);
  }
  if (shared == 0) return false;
  return shared > prefix_->match(r.prompt, limit, scratch);
}

std::vector<generation_result> generator::step() {
  // Admission: whole groups, first come first served, while they fit; a prompt that would
  // prefill blocks another admitted prompt prefills in this pass waits one step.
  std::vector<std::shared_ptr<request>> admitted;
  std::int64_t occupied = live_samples();
  std::vector<std::int32_t> scratch;
  for (auto it = queue_.begin(); it != queue_.end() && occupied + (*it)->group_size <= opts_.max_batch;) {
    if (shares_uncached_prefill(**it, admitted, scratch)) {
      ++it;
      continue;
    }
    occupied += (*it)->group_size;
    admitted.push_back(std::move(*it));
    it = queue_.erase(it);
  }
  const auto started = std::chrono::steady_clock::now();
  const std::int64_t max_seq = model_.dims().max_seq;
  const std::int64_t vocab_size = model_.dims().vocab;
  // Drafts, clamped so that every token the sample may emit stays within max_new_tokens
  // (the last emitted token is never a draft token) and every fed position within max_seq.
  std::vector<std::vector<std::int32_t>> drafts(live_.size());
  bool any_draft = false;
  if (speculating()) {
    for (std::size_t i = 0; i < live_.size(); ++i) {
      const sample& s = *live_[i];
      const auto used = static_cast<std::int64_t>(s.tokens.size());
      const auto fed = static_cast<std::int64_t>(s.req->prompt.size()) + used;  // cache + the last token
      const std::int64_t allowed = std::min<std::int64_t>(
          {opts_.max_draft_tokens, s.req->params.max_new_tokens - used - 1, max_seq - fed});
      if (allowed < 1) continue;
      const auto t0 = std::chrono::steady_clock::now();
      opts_.drafts->draft(s.req->id, s.index, static_cast<std::int32_t>(allowed), drafts[i]);
      const std::int64_t ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      spec_.draft_ns += ns;
      ++spec_.draft_calls;
      live_[i]->spec.draft_ns += ns;
      ++live_[i]->spec.draft_calls;
      std::vector<std::int32_t>& d = drafts[i];
      if (static_cast<std::int64_t>(d.size()) > allowed) d.resize(static_cast<std::size_t>(allowed));
      const auto bad = std::find_if(d.begin(), d.end(), [&](std::int32_t t) { return t < 0 || t >= vocab_size; });
      d.erase(bad, d.end());
      any_draft = any_draft || !d.empty();
    }
  }
  // Decode rows (the last token of every live sample, then its draft), then prefill rows (an
  // admitted prompt, or the part of it past a continuation's parked KV).
  std::vector<seq_id> seqs;
  std::vector<std::vector<std::int32_t>> toks;
  seqs.reserve(live_.size() + admitted.size());
  toks.reserve(seqs.capacity());
  for (std::size_t i = 0; i < live_.size(); ++i) {
    seqs.push_back(live_[i]->seq);
    toks.push_back({live_[i]->tokens.back()});
    toks.back().insert(toks.back().end(), drafts[i].begin(), drafts[i].end());
  }
  std::vector<seq_id> prefill;
  std::size_t longest = 0;
  std::vector<std::int32_t> hit_blocks;
  for (const auto& r : admitted) {
    r->hit_len = 0;
    if (r->base >= 0) {
      prefill.push_back(r->base);
    } else {
      // The last prompt token is always fed: its logits draw the first token.
      const std::int64_t hit =
          prefix_ ? prefix_->match(r->prompt, static_cast<std::int64_t>(r->prompt.size()) - 1, hit_blocks) : 0;
      prefill.push_back(hit > 0 ? cache_->adopt(hit_blocks, hit) : cache_->create());
      r->hit_len = hit;
    }
    seqs.push_back(prefill.back());
    toks.emplace_back(r->prompt.begin() + r->base_len + r->hit_len, r->prompt.end());
    longest = std::max(longest, toks.back().size());
  }
  if (seqs.empty()) return {};
  // Verification needs every decode row's logits and prefills only their last: two passes.
  const bool separate = !live_.empty() && !admitted.empty() &&
                        (any_draft || static_cast<std::int64_t>(longest) >= opts_.separate_prefill_tokens);
  const logits_for decode_rows = any_draft ? logits_for::all : logits_for::last;

  std::vector<std::unique_ptr<sample>> fresh;
  std::vector<sampled_token> drawn;
  std::vector<std::size_t> drawn_end;  // drawn[drawn_end[i-1] .. drawn_end[i]) is sample i's
  try {
    at::Tensor logits;
    if (separate) {
      const auto cut = static_cast<std::ptrdiff_t>(live_.size());
      const std::vector<seq_id> dseqs(seqs.begin(), seqs.begin() + cut), pseqs(seqs.begin() + cut, seqs.end());
      const std::vector<std::vector<std::int32_t>> dtoks(toks.begin(), toks.begin() + cut),
          ptoks(toks.begin() + cut, toks.end());
      const at::Tensor decoded = model_.forward_cached(*cache_, dseqs, dtoks, decode_rows).to(c10::kCPU);
      const at::Tensor prefilled = model_.forward_cached(*cache_, pseqs, ptoks, logits_for::last).to(c10::kCPU);
      logits = at::cat({decoded, prefilled}).contiguous();
    } else {
      logits = model_.forward_cached(*cache_, seqs, toks, live_.empty() ? logits_for::last : decode_rows)
                   .to(c10::kCPU)
                   .contiguous();
    }
    const std::int64_t vocab = logits.size(1);
    const float* row = logits.data_ptr<float>();
    // A sample reads only its own logits rows and draws from its own stream, so the live
    // samples are drawn in parallel (each pass over the vocabulary is ~0.1 ms) and joined in
    // order: the same tokens as one after another.
    std::vector<const float*> rows_of(live_.size());
    for (std::size_t i = 0; i < live_.size(); ++i) {
      rows_of[i] = row;
      row += static_cast<std::int64_t>(any_draft ? drafts[i].size() + 1 : 1) * vocab;
    }
    std::vector<std::vector<sampled_token>> drawn_by(live_.size());
    at::parallel_for(0, static_cast<std::int64_t>(live_.size()), 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        const auto k = static_cast<std::size_t>(i);
        sample& s = *live_[k];
        verify_draft(rows_of[k], vocab, drafts[k].data(), drafts[k].size(), s.req->params, s.rng, drawn_by[k]);
      }
    });
    for (const auto& d : drawn_by) {
      drawn.insert(drawn.end(), d.begin(), d.end());
      drawn_end.push_back(drawn.size());
    }
    // Fork every sibling before any of them can finish and release the shared prompt.
    for (std::size_t r = 0; r < admitted.size(); ++r) {
      for (std::int64_t i = 0; i < admitted[r]->group_size; ++i) {
        const seq_id s = i == 0 ? prefill[r] : cache_->fork(prefill[r]);
        fresh.push_back(std::make_unique<sample>(admitted[r], admitted[r]->streams[static_cast<std::size_t>(i)], s));
        drawn.push_back(sample_token(row, vocab, admitted[r]->params, fresh.back()->rng));
        drawn_end.push_back(drawn.size());
      }
      row += vocab;
    }
  } catch (...) {
    // Leave the generator as before the step: live samples back to their lengths (fed draft
    // positions included), admitted groups back at the head of the queue (a continuation
    // keeps its parked prefix).
    for (const auto& s : live_) {
      const auto len = static_cast<std::int64_t>(s->req->prompt.size() + s->tokens.size()) - 1;
      if (cache_->length(s->seq) > len) cache_->truncate(s->seq, len);
    }
    for (const auto& f : fresh)
      if (f->seq != f->req->base && cache_->contains(f->seq)) cache_->release(f->seq);
    for (std::size_t r = 0; r < admitted.size(); ++r) {
      const seq_id s = prefill[r];
      if (!cache_->contains(s)) continue;
      if (admitted[r]->base == s) {
        if (cache_->length(s) > admitted[r]->base_len) cache_->truncate(s, admitted[r]->base_len);
      } else {
        cache_->release(s);
      }
    }
    for (auto it = admitted.rbegin(); it != admitted.rend(); ++it) queue_.push_front(*it);
    throw;
  }
  for (std::size_t r = 0; r < admitted.size(); ++r) {
    request& q = *admitted[r];
    const auto n = static_cast<std::int64_t>(q.prompt.size());
    ++prefill_.requests;
    prefill_.prompt_tokens += n;
    prefill_.parked_tokens += q.base_len;
    prefill_.hit_tokens += q.hit_len;
    prefill_.computed_tokens += n - q.base_len - q.hit_len;
    // Siblings forked the whole prompt; the first sample computed what was not cached.
    for (auto& f : fresh)
      if (f->req.get() == &q) f->cached = f->index == q.streams.front() ? q.base_len + q.hit_len : n;
    // A prompt continuing parked KV is its episode's own chat (see finish): only prompts
    // prefilled from the start, which later prompts and groups may share, enter the tree.
    if (prefix_ && q.base_len == 0) prefix_->insert(q.prompt, n, prefill[r]);
    q.base = -1;  // its first sample owns the sequence now
  }
  // What the live samples waited for this step: drafts, the forward pass(es), sampling.
  const std::int64_t step_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();

  std::vector<generation_result> done;
  std::vector<std::unique_ptr<sample>> next;
  next.reserve(live_.size() + fresh.size());
  std::size_t k = 0;
  std::size_t from = 0;
  std::int64_t decode_emitted = 0;
  const bool had_live = !live_.empty();
  auto advance = [&](std::unique_ptr<sample> s, const std::vector<std::int32_t>* draft) {
    const std::size_t to = drawn_end[k++];
    const std::size_t before = s->tokens.size();
    std::optional<finish_reason> why;
    for (std::size_t j = from; j < to && !why; ++j) {
      s->tokens.push_back(drawn[j].token);
      s->logprobs.push_back(drawn[j].logprob);
      why = s->req->stop.check(s->tokens);
      // The next token would sit at position prompt + tokens, past the model's context.
      if (!why && static_cast<std::int64_t>(s->req->prompt.size() + s->tokens.size()) >= max_seq)
        why = finish_reason::length;
    }
    from = to;
    const std::size_t emitted = s->tokens.size() - before;
    if (draft != nullptr) {
      decode_emitted += static_cast<std::int64_t>(emitted);
      if (opts_.drafts != nullptr) {
        sample_speculation& sp = s->spec;
        ++(draft->empty() ? sp.plain_steps : sp.verify_steps);
        (draft->empty() ? sp.plain_tokens : sp.verify_tokens) += static_cast<std::int64_t>(emitted);
        (draft->empty() ? sp.plain_ns : sp.verify_ns) += step_ns;
      }
      if (!draft->empty()) {
        std::size_t accepted = 0;
        while (accepted < emitted && accepted < draft->size() && s->tokens[before + accepted] == (*draft)[accepted])
          ++accepted;
        s->spec.drafted_tokens += static_cast<std::int64_t>(draft->size());
        s->spec.accepted_tokens += static_cast<std::int64_t>(accepted);
        spec_.drafted_tokens += static_cast<std::int64_t>(draft->size());
        spec_.accepted_tokens += static_cast<std::int64_t>(accepted);
        // Keep the KV of the accepted positions only: the cache holds every token but the
        // last emitted one, which the next step feeds.
        const auto keep = static_cast<std::int64_t>(s->req->prompt.size() + s->tokens.size()) - 1;
        if (cache_->length(s->seq) > keep) cache_->truncate(s->seq, keep);
      }
    }
    if (opts_.drafts != nullptr) {
      if (!s->drafting) {
        opts_.drafts->start(s->req->id, s->index, s->req->prompt);
        s->drafting = true;
      }
      opts_.drafts->extend(s->req->id, s->index, s->tokens.data() + before, emitted);
    }
    if (why)
      done.push_back(finish(*s, *why));
    else
      next.push_back(std::move(s));
  };
  for (std::size_t i = 0; i < live_.size(); ++i) advance(std::move(live_[i]), &drafts[i]);
  for (auto& s : fresh) advance(std::move(s), nullptr);
  live_ = std::move(next);
  if (had_live) {
    ++(any_draft ? spec_.verify_steps : spec_.plain_steps);
    if (admitted.empty()) {
      spec_.decode_tokens += decode_emitted;
      spec_.decode_ns +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
    }
  }
  return done;
}

speculation_stats generator::take_speculation_stats() noexcept {
  const speculation_stats out = spec_;
  spec_ = speculation_stats{};
  return out;
}

std::vector<generation_result> generator::run_until_idle() {
  std::vector<generation_result> all;
  while (!idle()) {
    auto done = step();
    for (auto& r : done) all.push_back(std::move(r));
  }
  return all;
}

std::vector<generation_result> generator::abort(std::uint64_t request_id) {
  std::vector<generation_result> out;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if ((*it)->id != request_id) {
      ++it;
      continue;
    }
    for (std::int64_t i = 0; i < (*it)->group_size; ++i) {
      sample s(*it, (*it)->streams[static_cast<std::size_t>(i)], -1);
      out.push_back(finish(s, finish_reason::abort));
    }
    drop_request_kv(**it);
    it = queue_.erase(it);
  }
  std::vector<std::unique_ptr<sample>> keep;
  for (auto& s : live_) {
    if (s->req->id == request_id)
      out.push_back(finish(*s, finish_reason::abort));
    else
      keep.push_back(std::move(s));
  }
  live_ = std::move(keep);
  return out;
}

}  // namespace sorl::ml
