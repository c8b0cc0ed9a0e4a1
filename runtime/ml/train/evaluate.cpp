#include "runtime/ml/train/evaluate.hpp"

#include "runtime/ml/policy/generate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace sorl::ml {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// splitmix64's finaliser; decorrelates the per-prompt sampling seeds.
std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::uint64_t sample_seed(std::uint64_t seed, std::uint64_t index, int turn) {
  return mix(mix(seed) ^ mix(index * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(turn)));
}

void check(const eval_options& o) {
  if (o.count < 0)
    throw std::invalid_argument(fmt::format("eval_options.count must be >= 0, got {}", o.count));
  if (o.max_new_tokens < 1)
    throw std::invalid_argument(
        fmt::format("eval_options.max_new_tokens must be >= 1, got {}", o.max_new_tokens));
  if (o.batch < 1)
    throw std::invalid_argument(fmt::format("eval_options.batch must be >= 1, got {}", o.batch));
  if (!o.greedy && !(o.temperature >= min_temperature && std::isfinite(o.temperature)))
    throw std::invalid_argument(
        fmt::format("eval_options.temperature must be finite and >= {} when sampling, got {}",
                    min_temperature, o.temperature));
  if (o.keep_samples < 0)
    throw std::invalid_argument(
        fmt::format("eval_options.keep_samples must be >= 0, got {}", o.keep_samples));
}

sampling_params base_params(const eval_options& o, std::vector<std::int32_t> stop_ids) {
  sampling_params p;
  p.temperature = o.greedy ? 0.0 : o.temperature;
  p.max_new_tokens = o.max_new_tokens;
  p.eos_token_ids = std::move(stop_ids);
  return p;
}

// The completion's text: the stop token (last token of an eos finish) dropped, specials skipped.
std::string completion_text(const tokenizer& tok, const generation_result& r) {
  std::vector<token_id> body = r.tokens;
  if (r.reason == finish_reason::eos && !body.empty()) body.pop_back();
  return tok.decode(body, decode_specials::skip);
}

bool truncated(const generation_result& r) { return r.reason == finish_reason::length; }

// A reward that could not be computed for `item` ("prompt 3 of split eval"): masked out of
// the report's reward figures, or the end of the evaluation (eval_options).
void reward_failed(eval_sample& s, std::string why, const eval_options& o, const std::string& item) {
  if (o.fail_on_reward_failure)
    throw eval_reward_failed(fmt::format("evaluate: the reward of {} failed: {}", item, why));
  s.reward_failed = true;
  s.reward = 0.0;
  s.reason = std::move(why);
}

// Why `reward` is no reward, or nothing when it is one (finite).
std::optional<std::string> not_finite(double reward, const std::string& reason) {
  if (std::isfinite(reward)) return std::nullopt;
  return fmt::format("reward {} is not finite ({})", reward, reason);
}

void finish_report(eval_report& rep, const std::vector<eval_sample>& all, std::int64_t keep,
                   std::int64_t generated, clock_type::time_point start) {
  rep.count = static_cast<std::int64_t>(all.size());
  double reward = 0.0, tokens = 0.0, turns = 0.0;
  for (const auto& s : all) {
    tokens += static_cast<double>(s.response_tokens);
    turns += s.turns;
    if (s.reward_failed) {
      ++rep.reward_failures;
      continue;
    }
    reward += s.reward;
    if (s.reward == 1.0) ++rep.correct;
  }
  if (rep.count > 0) {
    const double n = static_cast<double>(rep.count);
    rep.mean_response_tokens = tokens / n;
    rep.mean_turns = turns / n;
  }
  if (const std::int64_t scored = rep.count - rep.reward_failures; scored > 0) {
    rep.accuracy = static_cast<double>(rep.correct) / static_cast<double>(scored);
    rep.mean_reward = reward / static_cast<double>(scored);
  }
  rep.seconds = seconds_since(start);
  rep.tokens_per_second = rep.seconds > 0.0 ? static_cast<double>(generated) / rep.seconds : 0.0;
  const auto k = static_cast<std::size_t>(std::min<std::int64_t>(keep, rep.count));
  rep.samples.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k));
}

// How many prompts of a split exist from `first` on, capped at `count`.
std::int64_t block_size(std::optional<std::uint64_t> size, std::uint64_t first, std::int64_t count) {
  if (!size) return count;
  if (first >= *size) return 0;
  return static_cast<std::int64_t>(std::min<std::uint64_t>(*size - first, static_cast<std::uint64_t>(count)));
}

}  // namespace

namespace {

/// The single-turn evaluation with prompts encoded by `encode` and completions ending at
/// `stop_ids`.
eval_report evaluate_single_turn(const policy_model& model, const tokenizer& tok,
                                 const std::function<std::vector<token_id>(const std::string&)>& encode,
                                 std::vector<token_id> stop_ids, const single_turn_task& task,
                                 const eval_options& opts) {
  check(opts);
  const auto start = clock_type::now();
  const std::int64_t n = block_size(task.size(opts.split), opts.first_index, opts.count);
  const std::int64_t max_seq = model.dims().max_seq;

  std::vector<task_prompt> prompts;
  prompts.reserve(static_cast<std::size_t>(n));
  generator gen(model, generator_options{opts.batch, kv_cache_options{}});
  const sampling_params base = base_params(opts, std::move(stop_ids));
  std::unordered_map<std::uint64_t, std::size_t> slot;  // request id → position in prompts
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t index = opts.first_index + static_cast<std::uint64_t>(i);
    prompts.push_back(task.prompt(opts.split, index));
    std::vector<token_id> ids = encode(prompts.back().prompt);
    if (static_cast<std::int64_t>(ids.size()) >= max_seq)
      throw std::invalid_argument(fmt::format(
          "evaluate: prompt {} of split {} has {} tokens; the model's context is {}", index,
          to_string(opts.split), ids.size(), max_seq));
    sampling_params p = base;
    p.seed = sample_seed(opts.seed, index, 0);
    slot[gen.submit(std::move(ids), p, 1)] = prompts.size() - 1;
  }

  std::vector<eval_sample> all(static_cast<std::size_t>(n));
  std::int64_t generated = 0;
  std::int64_t cut = 0;
  for (const generation_result& r : gen.run_until_idle()) {
    const std::size_t i = slot.at(r.request_id);
    eval_sample& s = all[i];
    s.index = prompts[i].index;
    s.prompt = prompts[i].prompt;
    s.completion = completion_text(tok, r);
    std::optional<std::string> failure;
    try {
      const reward_result score = task.score(prompts[i], s.completion);
      s.reward = score.reward;
      s.reason = score.reason;
      failure = not_finite(score.reward, score.reason);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (failure)
      reward_failed(s, std::move(*failure), opts,
                    fmt::format("prompt {} of split {}", s.index, to_string(opts.split)));
    s.turns = 1;
    s.response_tokens = static_cast<std::int64_t>(r.tokens.size());
    generated += s.response_tokens;
    if (truncated(r)) ++cut;
  }
  eval_report rep;
  rep.truncated = cut;
  finish_report(rep, all, opts.keep_samples, generated, start);
  return rep;
}

}  // namespace

eval_report evaluate(const policy_model& model, const tokenizer& tok, const single_turn_task& task,
                     const eval_options& opts) {
  return evaluate_single_turn(
      model, tok, [&](const std::string& text) { return encode_single_turn_prompt(tok, text); },
      {tok.special_id(special_token::eos)}, task, opts);
}

eval_report evaluate(const policy_model& model, const prompt_format& format, const any_task& task,
                     const eval_options& opts) {
  if (format.is_byte_level())
    return evaluate(model, format.tok(), task, opts);
  if (!task.single_turn)
    throw std::invalid_argument(fmt::format(
        "evaluate: prompt format '{}' encodes single-turn tasks; task '{}' is multi-turn",
        format.name(), task.name()));
  return evaluate_single_turn(
      model, format.tok(), [&](const std::string& text) { return format.single_turn(text); },
      format.stop_ids(), *task.single_turn, opts);
}

eval_report evaluate(const policy_model& model, const tokenizer& tok, const multi_turn_task& task,
                     const eval_options& opts) {
  check(opts);
  const auto start = clock_type::now();
  const std::int64_t max_seq = model.dims().max_seq;

  struct episode {
    std::unique_ptr<environment> env;
    std::vector<chat_message> chat;
    std::vector<std::string> actions;
    bool done = false;
    eval_sample result;
    std::vector<token_id> ids;  // the chat as last submitted
    parked_kv kv = 0;           // the last action's KV: ids + action tokens but the last
    std::vector<token_id> kv_tokens;
  };
  std::vector<episode> eps(static_cast<std::size_t>(opts.count));
  for (std::size_t i = 0; i < eps.size(); ++i) {
    episode& e = eps[i];
    e.result.index = opts.first_index + i;
    e.result.turns = 0;
    e.env = task.make_environment();
    e.result.prompt = e.env->reset(task.episode_seed(opts.split, e.result.index));
    e.chat.push_back({chat_role::user, e.result.prompt});
  }

  // Actions stop at end-of-turn; EOS also ends one, in case the model closes the whole chat.
  const sampling_params base = base_params(
      opts, {tok.special_id(special_token::end_turn), tok.special_id(special_token::eos)});
  std::int64_t generated = 0;
  std::int64_t cut = 0;
  // Turn waves: every waiting episode's next action is decoded in one batch. One generator
  // for all of them keeps each episode's KV from its last action, so a turn prefills only the
  // new observation (and the action's stop token), not the whole chat again.
  generator gen(model, generator_options{opts.batch, kv_cache_options{}});
  for (int turn = 0; turn < task.max_turns(); ++turn) {
    std::unordered_map<std::uint64_t, std::size_t> slot;
    for (std::size_t i = 0; i < eps.size(); ++i) {
      episode& e = eps[i];
      if (e.done) continue;
      e.ids = encode_chat(tok, e.chat, /*add_generation_prompt=*/true);
      kv_reuse reuse{true, std::exchange(e.kv, 0)};
      // The chat is re-encoded from text: an action whose tokens do not round-trip (a special
      // token inside it) no longer extends the KV, and that turn prefills from scratch.
      const bool extends = e.kv_tokens.size() < e.ids.size() &&
                           std::equal(e.kv_tokens.begin(), e.kv_tokens.end(), e.ids.begin());
      if (reuse.from != 0 && !extends) gen.release(std::exchange(reuse.from, 0));
      if (static_cast<std::int64_t>(e.ids.size()) >= max_seq) {
        gen.release(reuse.from);
        e.done = true;
        e.result.reason = fmt::format("chat of {} tokens fills the model's context ({})",
                                      e.ids.size(), max_seq);
        continue;
      }
      sampling_params p = base;
      p.seed = sample_seed(opts.seed, e.result.index, turn);
      slot[gen.submit(e.ids, p, 1, {}, reuse)] = i;
    }
    if (slot.empty()) break;
    for (const generation_result& r : gen.run_until_idle()) {
      episode& e = eps[slot.at(r.request_id)];
      e.kv = r.parked;
      e.kv_tokens = e.ids;
      e.kv_tokens.insert(e.kv_tokens.end(), r.tokens.begin(), r.tokens.end() - (r.tokens.empty() ? 0 : 1));
      std::string action = completion_text(tok, r);
      e.result.response_tokens += static_cast<std::int64_t>(r.tokens.size());
      generated += static_cast<std::int64_t>(r.tokens.size());
      if (truncated(r)) ++cut;
      env_step step;
      std::optional<std::string> failure;
      try {
        step = e.env->step(action);
        failure = not_finite(step.reward, step.reason);
      } catch (const std::exception& ex) {
        failure = ex.what();
      }
      if (failure) {
        // The episode ends here: its environment is in no state to go on.
        reward_failed(e.result, std::move(*failure), opts,
                      fmt::format("episode {} of split {} (turn {})", e.result.index,
                                  to_string(opts.split), turn + 1));
        e.result.turns = turn + 1;
        e.actions.push_back(std::move(action));
        e.done = true;
        gen.release(std::exchange(e.kv, 0));
        continue;
      }
      e.result.turns = e.env->turns();
      e.result.reward += step.reward;
      e.result.reason = step.reason;
      e.actions.push_back(action);
      e.chat.push_back({chat_role::assistant, std::move(action)});
      if (step.done) {
        e.done = true;
        gen.release(std::exchange(e.kv, 0));
      } else {
        e.chat.push_back({chat_role::user, step.observation});
      }
    }
  }

  std::vector<eval_sample> all;
  all.reserve(eps.size());
  for (episode& e : eps) {
    if (!e.done && e.result.reason.empty())
      e.result.reason = fmt::format("no result within {} turns", task.max_turns());
    for (std::size_t a = 0; a < e.actions.size(); ++a)
      e.result.completion += (a == 0 ? "" : " | ") + e.actions[a];
    e.result.reward = std::clamp(e.result.reward, 0.0, 1.0);
    all.push_back(std::move(e.result));
  }
  eval_report rep;
  rep.truncated = cut;
  finish_report(rep, all, opts.keep_samples, generated, start);
  return rep;
}

eval_report evaluate(const policy_model& model, const tokenizer& tok, const any_task& task,
                     const eval_options& opts) {
  if (task.single_turn) return evaluate(model, tok, *task.single_turn, opts);
  if (task.multi_turn) return evaluate(model, tok, *task.multi_turn, opts);
  throw std::invalid_argument("evaluate: the task is empty (neither single- nor multi-turn)");
}

}  // namespace sorl::ml
