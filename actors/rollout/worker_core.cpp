#include "actors/rollout/worker_core.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "runtime/config.hpp"
#include "runtime/ml/policy/device.hpp"
#include "runtime/ml/policy/torch_compat.hpp"
#include "runtime/ml/train/evaluate.hpp"

namespace sorl::rollout {

worker_options worker_options_from(const experiment_config& cfg) {
  worker_options o;
  o.max_batch = cfg.rollout.max_batch;
  o.chunk_tokens = cfg.rollout.chunk_tokens;
  const auto& r = cfg.rollout;
  o.prefix_cache_bytes = r.prefix_cache_bytes;
  o.speculative = r.speculative == "on"     ? speculation_mode::on
                  : r.speculative == "auto" ? speculation_mode::automatic
                                            : speculation_mode::off;
  o.drafter.max_depth = static_cast<int32_t>(r.suffix_max_depth);
  o.drafter.global_bytes = static_cast<size_t>(r.suffix_global_bytes);
  o.drafter.draft.max_tokens = static_cast<int32_t>(r.draft_max_tokens);
  o.drafter.draft.min_token_prob = r.draft_min_token_prob;
  o.drafter.draft.spec_factor = r.draft_spec_factor;
  o.device = r.device.empty() ? ml::device_from(cfg.run.device, "run.device")
                              : ml::device_from(r.device, "rollout.device");
  return o;
}

// The generator's draft hook on the suffix drafter: a sample is (generator request, stream).
class worker_core::draft_adapter final : public ml::draft_source {
public:
  explicit draft_adapter(const suffix_index::drafter_options& o) : drafter(o) {}
  void start(uint64_t request_id, int64_t sample, const std::vector<int32_t>& prompt) override {
    drafter.start(request_id, sample, prompt.data(), prompt.size());
  }
  void extend(uint64_t request_id, int64_t sample, const int32_t* tokens, size_t n) override {
    drafter.extend(request_id, sample, tokens, n);
  }
  void draft(uint64_t request_id, int64_t sample, int32_t max_tokens, std::vector<int32_t>& out) override {
    const auto& d = drafter.propose(request_id, sample, max_tokens);
    out.assign(d.tokens.begin(), d.tokens.end());
  }
  void finish(uint64_t request_id, int64_t sample, bool completed) override {
    drafter.finish(request_id, sample, completed);
  }
  suffix_index::suffix_drafter drafter;
};

namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

/// Seed of turn `turn` of a rollout: turns draw fresh streams, reproducibly.
uint64_t turn_seed(uint64_t seed, uint32_t turn) {
  if (turn == 0)
    return seed;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (turn + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

} // namespace

struct worker_core::rollout_state {
  rollout_request req;
  ml::task_prompt prompt;                  ///< single-turn
  std::unique_ptr<ml::environment> env;    ///< multi-turn
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> context;            ///< prompt + response so far
  std::vector<int32_t> response;
  std::vector<uint8_t> mask;
  std::vector<float> logprobs;
  uint32_t turns = 0;
  int64_t start_ns = 0;
  double reward = 0.0;
  std::string reason;
  rollout_status status = rollout_status::ok;
  std::string failure;
  bool truncated = false;                  ///< the context filled up between turns
  bool live = false;                       ///< submitted to the generator
  speculation_counts speculation;          ///< summed over its turns
  prefill_counts prefill;                  ///< summed over its turns
  /// Multi-turn, between turns: the generator's parked KV of `context` minus its last token,
  /// which the next turn continues from; released by finalize(). 0 = none.
  ml::parked_kv kv = 0;
};

worker_core::worker_core(const ml::model_dims& dims, ml::any_task task, worker_options opts,
                         ml::prompt_format format)
  : task_(std::move(task)), format_(std::move(format)), opts_(std::move(opts)) {
  if (!task_.single_turn && !task_.multi_turn)
    throw std::invalid_argument("worker_core: empty task");
  if (task_.multi_turn && !format_.is_byte_level())
    throw std::invalid_argument(fmt::format("worker_core: multi-turn task '{}' needs sorl's byte "
                                            "format, not prompt format '{}'",
                                            task_.name(), format_.name()));
  if (!opts_.clock)
    opts_.clock = steady_ns;
  model_ = std::make_unique<ml::policy_model>(
    ml::policy_model{dims, 0, /*init_std=*/0.02, opts_.device}.clone(c10::kBFloat16));
  if (!opts_.device.is_cpu())
    for (const auto& [name, t] : model_->parameters())
      host_weights_.emplace_back(name, t.to(c10::kCPU).contiguous());
  ml::generator_options g;
  g.max_batch = opts_.max_batch;
  g.prefix_cache_tokens = prefix_cache_tokens(dims, opts_.prefix_cache_bytes);
  if (opts_.speculative != speculation_mode::off) {
    drafts_ = std::make_unique<draft_adapter>(opts_.drafter);
    g.drafts = drafts_.get();
    g.max_draft_tokens = std::max(1, opts_.drafter.draft.max_tokens);
    switch_ = std::make_unique<speculation_switch>(g.max_draft_tokens);
  }
  gen_ = std::make_unique<ml::generator>(*model_, g);
}

worker_core::~worker_core() = default;

std::vector<std::string> worker_core::take_log() {
  return switch_ ? switch_->take_log() : std::vector<std::string>{};
}

std::optional<suffix_index::drafter_stats> worker_core::take_drafter_stats() {
  if (!drafts_)
    return std::nullopt;
  return drafts_->drafter.take_stats();
}

std::vector<std::vector<int32_t>> worker_core::take_finished_turns() {
  return std::exchange(finished_turns_, {});
}

size_t worker_core::add_peer_responses(const std::vector<std::vector<int32_t>>& responses) {
  if (!drafts_)
    return 0;
  const int64_t vocab = model_->dims().vocab;
  size_t taken = 0;
  for (const auto& r : responses) {
    const bool valid = !r.empty() && std::all_of(r.begin(), r.end(), [&](int32_t t) {
      return t >= 0 && t < vocab;
    });
    if (!valid)
      continue;
    drafts_->drafter.add_response(r.data(), r.size());
    ++taken;
  }
  return taken;
}

ml::policy_model& worker_core::model() {
  return *model_;
}

const std::vector<ml::named_tensor>& worker_core::sync_targets() const {
  return opts_.device.is_cpu() ? model_->parameters() : host_weights_;
}

void worker_core::weights_changed() {
  if (!rollouts_.empty())
    throw std::logic_error("worker_core: weights changed with rollouts in flight");
  // KV computed under the old weights must never be continued under the new ones.
  if (!host_weights_.empty()) {
    at::NoGradGuard no_grad;
    const auto& params = model_->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].second.copy_(host_weights_[i].second);
  }
  gen_->set_weights_version(++weights_version_);
  model_->refresh_compute_weights();
}

int64_t worker_core::prefix_cache_tokens(const ml::model_dims& dims, int64_t bytes) {
  const int64_t per_token = dims.n_layers * 2 * dims.n_kv_heads * dims.head_dim() * 4;
  return per_token > 0 ? bytes / per_token : 0;
}

ml::prefill_stats worker_core::take_prefill_stats() {
  absorb_prefill_stats();
  return std::exchange(prefill_, {});
}

int64_t worker_core::absorb_prefill_stats() {
  const ml::prefill_stats now = gen_->take_prefill_stats();
  prefill_ += now;
  return now.evicted_blocks;
}

std::vector<int32_t> first_prompt_tokens(const ml::any_task& task, const ml::prompt_format& format,
                                         ml::task_split split, uint64_t index) {
  if (task.single_turn)
    return format.single_turn(task.single_turn->prompt(split, index).prompt);
  if (!task.multi_turn)
    throw std::invalid_argument("first_prompt_tokens: empty task");
  auto env = task.multi_turn->make_environment();
  auto first = env->reset(task.multi_turn->episode_seed(split, index));
  return ml::encode_chat(ml::byte_tokenizer{}, {ml::chat_message{ml::chat_role::user, first}}, true);
}

void worker_core::enqueue(const rollout_request& r) {
  if (rollouts_.count(r.request_id))
    throw std::invalid_argument(fmt::format("rollout {} is already held", r.request_id));
  auto st = std::make_unique<rollout_state>();
  st->req = r;
  std::string refused;
  try {
    if (task_.single_turn) {
      st->prompt = task_.single_turn->prompt(r.split, r.task_index);
      st->prompt_tokens = format_.single_turn(st->prompt.prompt);
    } else {
      st->env = task_.multi_turn->make_environment();
      auto first = st->env->reset(task_.multi_turn->episode_seed(r.split, r.task_index));
      st->prompt_tokens =
        ml::encode_chat(tok_, {ml::chat_message{ml::chat_role::user, first}}, true);
    }
    auto max_seq = model_->dims().max_seq;
    if (static_cast<int64_t>(st->prompt_tokens.size()) >= max_seq)
      refused = fmt::format("prompt of {} tokens does not fit the context of {} tokens",
                            st->prompt_tokens.size(), max_seq);
  } catch (const std::exception& e) {
    refused = std::string{"cannot build the prompt: "} + e.what();
  }
  auto& held = hold(std::move(st));
  if (refused.empty())
    pending_.push_back(r.request_id);
  else
    fail(held, refused);
}

void worker_core::reject(const rollout_request& r, const std::string& why) {
  if (rollouts_.count(r.request_id))
    throw std::invalid_argument(fmt::format("rollout {} is already held", r.request_id));
  auto st = std::make_unique<rollout_state>();
  st->req = r;
  fail(hold(std::move(st)), why);
}

worker_core::rollout_state& worker_core::hold(std::unique_ptr<rollout_state> st) {
  st->context = st->prompt_tokens;
  st->start_ns = opts_.clock();
  const auto& r = st->req;
  events_.push_back({r.request_id, r.step, r.group_id, event_kind::start, st->start_ns, 0, {}});
  auto& held = *st;
  rollouts_.emplace(r.request_id, std::move(st));
  return held;
}

void worker_core::fail(rollout_state& st, const std::string& why) {
  st.status = rollout_status::failed;
  st.failure = why;
  st.reward = 0.0;
  st.reason = why;
  ready_.push_back(finalize(st, ml::finish_reason::abort));
}

ml::sampling_params worker_core::sampling_for(const rollout_request& r, uint32_t turn) const {
  ml::sampling_params p;
  p.temperature = r.temperature;
  p.top_p = r.top_p;
  p.top_k = r.top_k;
  p.max_new_tokens = r.max_new_tokens;
  p.seed = turn_seed(r.seed, turn);
  if (!format_.is_byte_level()) {
    p.eos_token_ids = format_.stop_ids();
    return p;
  }
  p.eos_token_ids = {tok_.special_id(ml::special_token::eos)};
  if (task_.multi_turn)
    p.eos_token_ids.push_back(tok_.special_id(ml::special_token::end_turn));
  return p;
}

void worker_core::submit_turn(rollout_state& st) {
  // A later turn continues from the previous turn's KV: only the environment's tokens and
  // the last action token are prefilled. Episodes further along are admitted first: the
  // step waits for its last episode, not its average one.
  uint64_t id = 0;
  try {
    id = gen_->submit(st.context, sampling_for(st.req, st.turns),
                      std::vector<int64_t>{static_cast<int64_t>(st.req.sample_index)}, {},
                      ml::kv_reuse{true, st.kv, static_cast<int64_t>(st.turns)});
  } catch (const std::invalid_argument& e) {
    fail(st, fmt::format("turn {} refused by the generator: {}", st.turns + 1, e.what()));
    return;
  }
  st.kv = 0;  // spent: the request owns the sequence now
  by_gen_[{id, st.req.sample_index}] = st.req.request_id;
  st.live = true;
}

void worker_core::flush_pending() {
  // Siblings at their first turn share prompt, seed and sampling settings: one submit, one
  // prefill, each sample on its own stream.
  std::map<uint64_t, std::vector<rollout_state*>> first_turn;
  for (auto id : pending_) {
    auto& st = *rollouts_.at(id);
    if (st.turns == 0)
      first_turn[st.req.group_id].push_back(&st);
    else
      submit_turn(st);
  }
  pending_.clear();
  for (auto& [group, members] : first_turn) {
    // Split into chunks the generator can admit whole.
    for (size_t from = 0; from < members.size(); from += static_cast<size_t>(opts_.max_batch)) {
      auto to = std::min(members.size(), from + static_cast<size_t>(opts_.max_batch));
      std::vector<int64_t> streams;
      for (size_t i = from; i < to; ++i)
        streams.push_back(members[i]->req.sample_index);
      uint64_t id = 0;
      try {
        id = gen_->submit(members[from]->context, sampling_for(members[from]->req, members[from]->turns), streams,
                          {}, ml::kv_reuse{task_.multi_turn != nullptr, 0});
      } catch (const std::invalid_argument& e) {
        for (size_t i = from; i < to; ++i)
          fail(*members[i], std::string{"refused by the generator: "} + e.what());
        continue;
      }
      for (size_t i = from; i < to; ++i) {
        by_gen_[{id, members[i]->req.sample_index}] = members[i]->req.request_id;
        members[i]->live = true;
      }
    }
  }
}

std::vector<rollout_result> worker_core::step() {
  // Results wait in ready_ until the end: if the generator throws midway, none is lost, and
  // abort_all() still returns them.
  flush_pending();
  if (gen_->idle())
    return std::exchange(ready_, {});
  const int64_t batch = gen_->live_samples();
  const bool automatic = opts_.speculative == speculation_mode::automatic;
  int32_t cap = opts_.speculative == speculation_mode::off ? 0 : opts_.drafter.draft.max_tokens;
  if (automatic && batch > 0)
    cap = switch_->decide(batch);
  gen_->set_speculating(cap > 0);
  if (cap > 0)
    gen_->set_max_draft_tokens(cap);
  auto finished = gen_->step();
  if (automatic) {
    // Only steps that admitted nothing time their decode work (generate.hpp).
    const ml::speculation_stats st = gen_->take_speculation_stats();
    if (batch > 0)
      switch_->observe(batch, cap, st.decode_tokens, st.decode_ns);
  }
  if (opts_.chunk_tokens > 0) {
    for (const auto& p : gen_->progress()) {
      auto it = by_gen_.find({p.request_id, p.sample_index});
      if (it == by_gen_.end())
        continue;
      auto& st = *rollouts_.at(it->second);
      auto tokens = static_cast<int64_t>(st.response.size()) + p.tokens;
      auto& last = chunked_[st.req.request_id];
      if (tokens - last >= opts_.chunk_tokens) {
        last = tokens;
        events_.push_back({st.req.request_id, st.req.step, st.req.group_id, event_kind::chunk,
                           opts_.clock(), static_cast<uint32_t>(tokens), {}});
      }
    }
  }
  for (auto& g : finished) {
    auto it = by_gen_.find({g.request_id, g.sample_index});
    if (it == by_gen_.end())
      throw std::logic_error("worker_core: generator returned an unknown sample");
    auto id = it->second;
    by_gen_.erase(it);
    // What the drafter keeps of its own samples (finish(keep = completed)) is what the other
    // workers get.
    if (drafts_ && g.reason != ml::finish_reason::abort && !g.tokens.empty())
      finished_turns_.push_back(g.tokens);
    auto& st = *rollouts_.at(id);
    st.live = false;
    st.kv = g.parked;
    if (finish_turn(st, g))
      ready_.push_back(finalize(st, st.truncated ? ml::finish_reason::length : g.reason));
  }
  return std::exchange(ready_, {});
}

bool worker_core::finish_turn(rollout_state& st, const ml::generation_result& g) {
  st.response.insert(st.response.end(), g.tokens.begin(), g.tokens.end());
  st.context.insert(st.context.end(), g.tokens.begin(), g.tokens.end());
  st.mask.insert(st.mask.end(), g.tokens.size(), 1);
  st.logprobs.insert(st.logprobs.end(), g.logprobs.begin(), g.logprobs.end());
  ++st.turns;
  auto& sc = st.speculation;
  sc.verify_steps += static_cast<uint32_t>(g.speculation.verify_steps);
  sc.plain_steps += static_cast<uint32_t>(g.speculation.plain_steps);
  sc.drafted_tokens += static_cast<uint32_t>(g.speculation.drafted_tokens);
  sc.accepted_tokens += static_cast<uint32_t>(g.speculation.accepted_tokens);
  sc.draft_calls += static_cast<uint32_t>(g.speculation.draft_calls);
  sc.draft_ns += static_cast<uint64_t>(g.speculation.draft_ns);
  sc.verify_tokens += static_cast<uint32_t>(g.speculation.verify_tokens);
  sc.verify_ns += static_cast<uint64_t>(g.speculation.verify_ns);
  sc.plain_tokens += static_cast<uint32_t>(g.speculation.plain_tokens);
  sc.plain_ns += static_cast<uint64_t>(g.speculation.plain_ns);
  st.prefill.prompt_tokens += static_cast<uint32_t>(g.prompt_tokens);
  st.prefill.cached_tokens += static_cast<uint32_t>(g.cached_tokens);
  std::vector<int32_t> body = g.tokens;
  if (g.reason == ml::finish_reason::eos && !body.empty())
    body.pop_back();
  auto text = format_.tok().decode(body, ml::decode_specials::skip);
  if (task_.single_turn) {
    try {
      auto r = task_.single_turn->score(st.prompt, text);
      st.reward = r.reward;
      st.reason = r.reason;
    } catch (const std::exception& e) {
      st.status = rollout_status::reward_failed;
      st.failure = std::string{"task error: "} + e.what();
    }
    return true;
  }
  ml::env_step step;
  try {
    step = st.env->step(text);
  } catch (const std::exception& e) {
    st.status = rollout_status::reward_failed;
    st.failure = std::string{"environment error: "} + e.what();
    return true;
  }
  st.reward += step.reward;
  st.reason = step.reason;
  if (step.done || st.turns >= static_cast<uint32_t>(task_.multi_turn->max_turns()))
    return true;
  // The environment's turn, in encode_chat's layout; none of it is trained on.
  std::vector<int32_t> env_tokens;
  auto end_turn = tok_.special_id(ml::special_token::end_turn);
  if (g.tokens.empty() || g.tokens.back() != end_turn)
    env_tokens.push_back(end_turn);
  env_tokens.push_back(tok_.special_id(ml::special_token::user));
  auto obs = tok_.encode(step.observation);
  env_tokens.insert(env_tokens.end(), obs.begin(), obs.end());
  env_tokens.push_back(end_turn);
  env_tokens.push_back(tok_.special_id(ml::special_token::assistant));
  if (static_cast<int64_t>(st.context.size() + env_tokens.size()) >= model_->dims().max_seq) {
    // Truncated, not failed: the episode's reward so far stands, and the finish reason says
    // length so that overlong filtering treats it as any response cut at the limit.
    st.reason = "context full after " + std::to_string(st.turns) + " turns";
    st.truncated = true;
    return true;
  }
  st.response.insert(st.response.end(), env_tokens.begin(), env_tokens.end());
  st.context.insert(st.context.end(), env_tokens.begin(), env_tokens.end());
  st.mask.insert(st.mask.end(), env_tokens.size(), 0);
  st.logprobs.insert(st.logprobs.end(), env_tokens.size(), 0.0f);
  events_.push_back({st.req.request_id, st.req.step, st.req.group_id, event_kind::chunk,
                     opts_.clock(), static_cast<uint32_t>(st.response.size()), {}});
  chunked_[st.req.request_id] = static_cast<int64_t>(st.response.size());
  pending_.push_back(st.req.request_id);
  return false;
}

rollout_result worker_core::finalize(rollout_state& st, ml::finish_reason reason) {
  // Every way out of a rollout passes here (end, truncation, failure, abort).
  gen_->release(std::exchange(st.kv, 0));
  rollout_result r;
  r.request = st.req;
  r.prompt = std::move(st.prompt_tokens);
  r.response = std::move(st.response);
  r.loss_mask = std::move(st.mask);
  r.logprobs = std::move(st.logprobs);
  if (st.status == rollout_status::ok && !std::isfinite(st.reward)) {
    st.status = rollout_status::reward_failed;
    st.failure = fmt::format("reward {} is not finite ({})", st.reward, st.reason);
  }
  r.status = st.status;
  r.failure = st.failure;
  r.reward = st.status == rollout_status::ok ? std::clamp(st.reward, 0.0, 1.0) : 0.0;
  r.reward_reason = st.status == rollout_status::ok ? st.reason : st.failure;
  r.finish = reason;
  r.turns = st.turns;
  r.speculation = st.speculation;
  r.prefill = st.prefill;
  // Evictions since the previous finished rollout ride on this one.
  r.prefill.evicted_blocks = static_cast<uint32_t>(absorb_prefill_stats());
  r.start_ns = st.start_ns;
  r.end_ns = opts_.clock();
  events_.push_back({st.req.request_id, st.req.step, st.req.group_id, event_kind::finish,
                     r.end_ns, static_cast<uint32_t>(r.response.size()), reason});
  chunked_.erase(st.req.request_id);
  rollouts_.erase(st.req.request_id);
  return r;
}

std::vector<rollout_result> worker_core::abort_all() {
  std::set<uint64_t> gen_ids;
  for (auto& [key, id] : by_gen_)
    gen_ids.insert(key.first);
  for (auto g : gen_ids)
    gen_->abort(g);
  by_gen_.clear();
  pending_.clear();
  chunked_.clear();
  std::vector<rollout_result> out = std::exchange(ready_, {});
  while (!rollouts_.empty()) {
    auto& st = *rollouts_.begin()->second;
    st.reward = 0.0;
    st.reason = "aborted";
    out.push_back(finalize(st, ml::finish_reason::abort));
  }
  return out;
}

std::vector<rollout_result> worker_core::abort(const std::vector<uint64_t>& request_ids) {
  std::set<uint64_t> wanted;
  for (auto id : request_ids)
    if (rollouts_.count(id))
      wanted.insert(id);
  // Whole generator submissions go: every (gen id, stream) that serves a wanted rollout.
  std::set<uint64_t> gen_ids;
  for (auto& [key, id] : by_gen_)
    if (wanted.count(id))
      gen_ids.insert(key.first);
  for (auto g : gen_ids) {
    for (auto it = by_gen_.begin(); it != by_gen_.end();) {
      if (it->first.first == g) {
        wanted.insert(it->second);
        it = by_gen_.erase(it);
      } else {
        ++it;
      }
    }
    gen_->abort(g);
  }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&](uint64_t id) { return wanted.count(id) > 0; }),
                 pending_.end());
  std::vector<rollout_result> out;
  for (auto id : wanted) {
    auto it = rollouts_.find(id);
    if (it == rollouts_.end())
      continue;
    auto& st = *it->second;
    st.reward = 0.0;
    st.reason = "aborted";
    out.push_back(finalize(st, ml::finish_reason::abort));
  }
  return out;
}

int64_t worker_core::kv_blocks_in_use() const {
  return gen_->cache().blocks_in_use();
}

int64_t worker_core::prefix_cached_blocks() const {
  return gen_->prefixes() ? gen_->prefixes()->cached_blocks() : 0;
}

std::vector<rollout_event> worker_core::take_events() {
  std::vector<rollout_event> out;
  out.swap(events_);
  return out;
}

bool worker_core::idle() const {
  return rollouts_.empty() && ready_.empty();
}

} // namespace sorl::rollout
