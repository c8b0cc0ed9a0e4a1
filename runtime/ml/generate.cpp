#include "runtime/ml/generate.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace sorl::ml {

struct generator::request {
  std::uint64_t id = 0;
  std::vector<std::int32_t> prompt;
  sampling_params params;
  std::int64_t group_size = 1;
  std::vector<std::int64_t> streams;  // random stream (= result sample_index) of each sibling
  stop_checker stop;

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

  sample(std::shared_ptr<request> r, std::int64_t i, seq_id s)
      : req(std::move(r)), index(i), seq(s), rng(req->params.seed, static_cast<std::uint64_t>(i)) {}
};

generator::generator(const policy_model& model, generator_options opts)
    : model_(model), opts_(opts) {
  if (opts.max_batch < 1)
    throw std::invalid_argument(fmt::format("generator_options.max_batch must be >= 1, got {}", opts.max_batch));
  cache_ = std::make_unique<kv_cache>(model.dims(), opts.cache, model.device(), c10::kFloat);
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
                                std::int64_t group_size, detokenize_fn detokenize) {
  if (group_size < 1 || group_size > opts_.max_batch)
    throw std::invalid_argument(fmt::format(
        "generator::submit: group_size {} outside [1, max_batch = {}]", group_size, opts_.max_batch));
  std::vector<std::int64_t> streams(static_cast<std::size_t>(group_size));
  for (std::int64_t i = 0; i < group_size; ++i) streams[static_cast<std::size_t>(i)] = i;
  return submit(std::move(prompt), params, std::move(streams), std::move(detokenize));
}

std::uint64_t generator::submit(std::vector<std::int32_t> prompt, const sampling_params& params,
                                std::vector<std::int64_t> streams, detokenize_fn detokenize) {
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
  const std::uint64_t id = next_request_++;
  queue_.push_back(std::make_shared<request>(id, std::move(prompt), params, std::move(streams), std::move(detokenize)));
  return id;
}

generation_result generator::finish(sample& s, finish_reason reason) {
  if (s.seq >= 0 && cache_->contains(s.seq)) cache_->release(s.seq);
  s.seq = -1;
  generation_result r;
  r.request_id = s.req->id;
  r.sample_index = s.index;
  r.prompt_tokens = static_cast<std::int64_t>(s.req->prompt.size());
  r.tokens = std::move(s.tokens);
  r.logprobs = std::move(s.logprobs);
  r.reason = reason;
  return r;
}

std::vector<generation_result> generator::step() {
  // Admission: whole groups, first come first served, while they fit.
  std::vector<std::shared_ptr<request>> admitted;
  std::int64_t occupied = live_samples();
  while (!queue_.empty() && occupied + queue_.front()->group_size <= opts_.max_batch) {
    occupied += queue_.front()->group_size;
    admitted.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  std::vector<seq_id> seqs;
  std::vector<std::vector<std::int32_t>> toks;
  seqs.reserve(live_.size() + admitted.size());
  toks.reserve(seqs.capacity());
  for (const auto& s : live_) {
    seqs.push_back(s->seq);
    toks.push_back({s->tokens.back()});
  }
  std::vector<seq_id> prefill;
  for (const auto& r : admitted) {
    prefill.push_back(cache_->create());
    seqs.push_back(prefill.back());
    toks.push_back(r->prompt);
  }
  if (seqs.empty()) return {};

  std::vector<std::unique_ptr<sample>> fresh;
  std::vector<sampled_token> drawn;
  try {
    const at::Tensor logits =
        model_.forward_cached(*cache_, seqs, toks, logits_for::last).to(c10::kCPU).contiguous();
    const std::int64_t vocab = logits.size(1);
    const float* row = logits.data_ptr<float>();
    for (const auto& s : live_) {
      drawn.push_back(sample_token(row, vocab, s->req->params, s->rng));
      row += vocab;
    }
    // Fork every sibling before any of them can finish and release the shared prompt.
    for (std::size_t r = 0; r < admitted.size(); ++r) {
      for (std::int64_t i = 0; i < admitted[r]->group_size; ++i) {
        const seq_id s = i == 0 ? prefill[r] : cache_->fork(prefill[r]);
        fresh.push_back(std::make_unique<sample>(admitted[r], admitted[r]->streams[static_cast<std::size_t>(i)], s));
        drawn.push_back(sample_token(row, vocab, admitted[r]->params, fresh.back()->rng));
      }
      row += vocab;
    }
  } catch (...) {
    // Leave the generator as before the step: live samples back to their lengths, admitted
    // groups back at the head of the queue.
    for (const auto& s : live_) {
      const auto len = static_cast<std::int64_t>(s->req->prompt.size() + s->tokens.size()) - 1;
      if (cache_->length(s->seq) > len) cache_->truncate(s->seq, len);
    }
    for (const auto& f : fresh)
      if (cache_->contains(f->seq)) cache_->release(f->seq);
    for (const seq_id s : prefill)
      if (cache_->contains(s)) cache_->release(s);
    for (auto it = admitted.rbegin(); it != admitted.rend(); ++it) queue_.push_front(*it);
    throw;
  }

  std::vector<generation_result> done;
  std::vector<std::unique_ptr<sample>> next;
  next.reserve(live_.size() + fresh.size());
  std::size_t k = 0;
  const std::int64_t max_seq = model_.dims().max_seq;
  auto advance = [&](std::unique_ptr<sample> s) {
    const sampled_token t = drawn[k++];
    s->tokens.push_back(t.token);
    s->logprobs.push_back(t.logprob);
    std::optional<finish_reason> why = s->req->stop.check(s->tokens);
    // The next token would sit at position prompt + tokens, past the model's context.
    if (!why && static_cast<std::int64_t>(s->req->prompt.size() + s->tokens.size()) >= max_seq)
      why = finish_reason::length;
    if (why)
      done.push_back(finish(*s, *why));
    else
      next.push_back(std::move(s));
  };
  for (auto& s : live_) advance(std::move(s));
  for (auto& s : fresh) advance(std::move(s));
  live_ = std::move(next);
  return done;
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
