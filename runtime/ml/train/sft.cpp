#include "runtime/ml/train/sft.hpp"

#include "runtime/ml/formats/checkpoint.hpp"
#include "runtime/ml/formats/tokenizer.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <sstream>
#include <stdexcept>

namespace sorl::ml {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

[[noreturn]] void bad_option(const std::string& what) {
  throw std::invalid_argument("sft_options." + what);
}

// AdamW with decoupled weight decay (Loshchilov & Hutter 2019, algorithm 2), the update
// torch.optim.AdamW makes, written on ATen so its state is two plain tensors per parameter
// that go straight into the checkpoint's optimizer file.
class adamw {
 public:
  adamw(const std::vector<named_tensor>& params, const sft_options& o) : o_(o) {
    for (const auto& [name, p] : params) {
      params_.push_back(p);
      names_.push_back(name);
      exp_avg_.push_back(at::zeros_like(p.detach()));
      exp_avg_sq_.push_back(at::zeros_like(p.detach()));
      // Norm gains (1-D) are scales around 1: pulling them to 0 would fight the model.
      decay_.push_back(p.dim() >= 2);
    }
  }

  // Global L2 norm of the current gradients (parameters without a gradient count as 0).
  double grad_norm() const {
    at::NoGradGuard no_grad;
    at::Tensor total = at::zeros({}, at::kDouble);
    for (const auto& p : params_)
      if (p.grad().defined()) total += p.grad().to(at::kDouble).pow(2).sum();
    return std::sqrt(total.item<double>());
  }

  // One update at learning rate `lr` with the gradients scaled by `grad_scale` (clipping);
  // then clears the gradients.
  void step(double lr, double grad_scale) {
    at::NoGradGuard no_grad;
    ++t_;
    const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(t_));
    const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(t_));
    for (std::size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& p = params_[i];
      if (!p.grad().defined()) continue;
      at::Tensor g = p.grad();
      if (grad_scale != 1.0) g = g * grad_scale;
      if (decay_[i] && o_.weight_decay > 0.0) p.mul_(1.0 - lr * o_.weight_decay);
      exp_avg_[i].mul_(o_.beta1).add_(g, 1.0 - o_.beta1);
      exp_avg_sq_[i].mul_(o_.beta2).addcmul_(g, g, 1.0 - o_.beta2);
      const at::Tensor denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bc2)).add_(o_.adam_eps);
      p.addcdiv_(exp_avg_[i], denom, -lr / bc1);
      p.grad().zero_();
    }
  }

  std::int64_t steps() const noexcept { return t_; }

  named_tensors state() const {
    named_tensors out;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      out.emplace_back(names_[i] + ".exp_avg", exp_avg_[i]);
      out.emplace_back(names_[i] + ".exp_avg_sq", exp_avg_sq_[i]);
    }
    return out;
  }

 private:
  const sft_options& o_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  std::vector<bool> decay_;
  std::int64_t t_ = 0;
};

// Linear warm-up to o.lr, then cosine decay to o.lr * min_lr_fraction at the last step.
// `step` counts from 0.
double lr_at(const sft_options& o, std::int64_t step) {
  const std::int64_t warm = std::min(o.warmup_steps, o.steps);
  if (step < warm) return o.lr * static_cast<double>(step + 1) / static_cast<double>(warm);
  const std::int64_t span = std::max<std::int64_t>(1, o.steps - warm - 1);
  const double progress = std::min(1.0, static_cast<double>(step - warm) / static_cast<double>(span));
  const double pi = std::acos(-1.0);
  return o.lr * (o.min_lr_fraction + (1.0 - o.min_lr_fraction) * 0.5 * (1.0 + std::cos(pi * progress)));
}

// Unbiased uniform index in [0, n) from a standard engine: the engine's raw output is
// specified by the standard, std::uniform_int_distribution is not (runs must agree across
// standard libraries).
std::size_t below(std::mt19937_64& rng, std::size_t n) {
  const std::uint64_t bound = static_cast<std::uint64_t>(n);
  const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % bound);
  std::uint64_t x = rng();
  while (x >= limit) x = rng();
  return static_cast<std::size_t>(x % bound);
}

// Shuffled epochs over a pool of `n` examples.
class batch_order {
 public:
  batch_order(std::size_t n, std::uint64_t seed) : rng_(seed ^ 0x5F7A1C3E9B2D4068ULL), order_(n) {
    for (std::size_t i = 0; i < n; ++i) order_[i] = i;
  }

  std::vector<std::size_t> next(std::size_t count) {
    std::vector<std::size_t> out;
    out.reserve(count);
    while (out.size() < count) {
      if (cursor_ == 0)
        for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[below(rng_, i)]);
      out.push_back(order_[cursor_]);
      cursor_ = (cursor_ + 1) % order_.size();
    }
    return out;
  }

  // Fisher-Yates with the order's own generator, so one seed fixes the whole schedule.
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(rng_, i)]);
  }

  std::string rng_state() const {
    std::ostringstream s;
    s << rng_;
    return s.str();
  }

 private:
  std::mt19937_64 rng_;
  std::vector<std::size_t> order_;
  std::size_t cursor_ = 0;
};

// Batches of similar lengths (sft_options::group_by_length): a window of `groups` batches
// from the shuffled order, sorted by length (stable, so ties keep the shuffled order), cut
// into batches that are then served in random order. A window is the plain order's next
// groups × batch examples, so every example is still seen once per epoch.
class length_grouped_order {
 public:
  length_grouped_order(batch_order& order, const std::vector<std::int64_t>& lengths, std::size_t batch,
                       std::size_t groups)
      : order_(order), lengths_(lengths), batch_(batch), groups_(groups) {}

  std::vector<std::size_t> next() {
    if (groups_ < 2) return order_.next(batch_);
    if (queue_.empty()) {
      std::vector<std::size_t> window = order_.next(batch_ * groups_);
      std::stable_sort(window.begin(), window.end(),
                       [&](std::size_t a, std::size_t b) { return lengths_[a] < lengths_[b]; });
      for (std::size_t g = 0; g < groups_; ++g)
        queue_.emplace_back(window.begin() + static_cast<std::ptrdiff_t>(g * batch_),
                            window.begin() + static_cast<std::ptrdiff_t>((g + 1) * batch_));
      order_.shuffle(queue_);
    }
    std::vector<std::size_t> out = std::move(queue_.back());
    queue_.pop_back();
    return out;
  }

 private:
  batch_order& order_;
  const std::vector<std::int64_t>& lengths_;
  std::size_t batch_, groups_;
  std::vector<std::vector<std::size_t>> queue_;
};

// A padded batch: inputs ids[:-1], targets ids[1:], right-padded with <|pad|>.
struct train_batch {
  at::Tensor inputs;     // [B, T] int64
  at::Tensor attention;  // [B, T] bool, true = real token
  at::Tensor targets;    // [B, T] int64 (pad where not a loss token)
  at::Tensor loss_mask;  // [B, T] fp32, 1 = loss token
  std::int64_t real_tokens = 0;
  std::int64_t loss_tokens = 0;
};

train_batch make_batch(const std::vector<sft_sequence>& pool, const std::vector<std::size_t>& pick,
                       token_id pad) {
  const auto B = static_cast<std::int64_t>(pick.size());
  std::int64_t T = 1;
  for (const std::size_t i : pick) T = std::max<std::int64_t>(T, static_cast<std::int64_t>(pool[i].ids.size()) - 1);
  train_batch b;
  b.inputs = at::full({B, T}, pad, at::kLong);
  b.targets = at::full({B, T}, pad, at::kLong);
  b.attention = at::zeros({B, T}, at::kBool);
  b.loss_mask = at::zeros({B, T}, at::kFloat);
  auto in = b.inputs.accessor<std::int64_t, 2>();
  auto tg = b.targets.accessor<std::int64_t, 2>();
  auto real = b.attention.accessor<bool, 2>();
  auto lm = b.loss_mask.accessor<float, 2>();
  for (std::int64_t r = 0; r < B; ++r) {
    const sft_sequence& s = pool[pick[static_cast<std::size_t>(r)]];
    const auto n = static_cast<std::int64_t>(s.ids.size()) - 1;
    for (std::int64_t j = 0; j < n; ++j) {
      in[r][j] = s.ids[static_cast<std::size_t>(j)];
      real[r][j] = true;
      if (s.loss_mask[static_cast<std::size_t>(j + 1)] != 0) {
        tg[r][j] = s.ids[static_cast<std::size_t>(j + 1)];
        lm[r][j] = 1.0f;
        ++b.loss_tokens;
      }
    }
    b.real_tokens += n;
  }
  return b;
}

std::string format_double(double v) { return fmt::format("{:.6g}", v); }

}  // namespace

void validate(const sft_options& o) {
  if (o.dims) {
    o.dims->validate();
    if (o.dims->vocab < byte_tokenizer::size)
      bad_option(fmt::format("dims.vocab must be >= {} (the byte tokenizer), got {}",
                             byte_tokenizer::size, o.dims->vocab));
  } else {
    (void)preset(o.preset);  // throws std::invalid_argument for an unknown name
  }
  if (!(o.init_std >= 0.0 && std::isfinite(o.init_std)))
    bad_option(fmt::format("init_std must be finite and >= 0, got {}", o.init_std));
  if (!(o.wrong_fraction >= 0.0 && o.wrong_fraction <= 1.0))
    bad_option(fmt::format("wrong_fraction must be in [0, 1], got {}", o.wrong_fraction));
  if (o.pool_size < 0) bad_option(fmt::format("pool_size must be >= 0, got {}", o.pool_size));
  if (o.steps < 1) bad_option(fmt::format("steps must be >= 1, got {}", o.steps));
  if (o.batch_size < 1) bad_option(fmt::format("batch_size must be >= 1, got {}", o.batch_size));
  std::int64_t sequences = 0; // run_sft draws steps × batch_size fresh demonstrations
  if (__builtin_mul_overflow(o.steps, o.batch_size, &sequences))
    bad_option(fmt::format("steps × batch_size = {} × {} overflows a 64-bit count", o.steps,
                           o.batch_size));
  if (!(o.lr > 0.0 && std::isfinite(o.lr))) bad_option(fmt::format("lr must be finite and > 0, got {}", o.lr));
  if (o.warmup_steps < 0) bad_option(fmt::format("warmup_steps must be >= 0, got {}", o.warmup_steps));
  if (!(o.min_lr_fraction >= 0.0 && o.min_lr_fraction <= 1.0))
    bad_option(fmt::format("min_lr_fraction must be in [0, 1], got {}", o.min_lr_fraction));
  if (!(o.weight_decay >= 0.0 && std::isfinite(o.weight_decay)))
    bad_option(fmt::format("weight_decay must be finite and >= 0, got {}", o.weight_decay));
  if (!(o.beta1 >= 0.0 && o.beta1 < 1.0)) bad_option(fmt::format("beta1 must be in [0, 1), got {}", o.beta1));
  if (!(o.beta2 >= 0.0 && o.beta2 < 1.0)) bad_option(fmt::format("beta2 must be in [0, 1), got {}", o.beta2));
  if (!(o.adam_eps > 0.0)) bad_option(fmt::format("adam_eps must be > 0, got {}", o.adam_eps));
  if (std::isnan(o.grad_clip)) bad_option("grad_clip must not be NaN");
  if (o.eval_count < 0) bad_option(fmt::format("eval_count must be >= 0, got {}", o.eval_count));
  if (o.eval_every < 0) bad_option(fmt::format("eval_every must be >= 0, got {}", o.eval_every));
  if (o.eval_max_new_tokens < 1)
    bad_option(fmt::format("eval_max_new_tokens must be >= 1, got {}", o.eval_max_new_tokens));
  if (o.eval_batch < 1) bad_option(fmt::format("eval_batch must be >= 1, got {}", o.eval_batch));
  if (o.threads < 0) bad_option(fmt::format("threads must be >= 0, got {}", o.threads));
  if (o.group_by_length < 0)
    bad_option(fmt::format("group_by_length must be >= 0, got {}", o.group_by_length));
}

std::vector<std::vector<std::size_t>> sft_batch_schedule(const std::vector<std::int64_t>& lengths,
                                                         std::int64_t steps, std::int64_t batch_size,
                                                         std::int64_t group_by_length, std::uint64_t seed) {
  if (lengths.empty()) throw std::invalid_argument("sft_batch_schedule: the pool is empty");
  if (batch_size < 1)
    throw std::invalid_argument(fmt::format("sft_batch_schedule: batch_size must be >= 1, got {}", batch_size));
  batch_order order(lengths.size(), seed);
  length_grouped_order grouped(order, lengths, static_cast<std::size_t>(batch_size),
                               static_cast<std::size_t>(std::max<std::int64_t>(0, group_by_length)));
  std::vector<std::vector<std::size_t>> out;
  out.reserve(static_cast<std::size_t>(std::max<std::int64_t>(0, steps)));
  for (std::int64_t s = 0; s < steps; ++s) out.push_back(grouped.next());
  return out;
}

model_dims sft_model_dims(const sft_options& o) { return o.dims ? *o.dims : preset(o.preset); }

sft_sequence encode_demonstration(const tokenizer& tok, const demonstration& d) {
  sft_sequence s;
  s.ids.push_back(tok.special_id(special_token::bos));
  for (const token_id t : tok.encode(d.prompt)) s.ids.push_back(t);
  s.loss_mask.assign(s.ids.size(), 0);
  for (const token_id t : tok.encode(d.completion)) s.ids.push_back(t);
  s.ids.push_back(tok.special_id(special_token::eos));
  s.loss_mask.resize(s.ids.size(), 1);
  return s;
}

sft_sequence encode_episode(const tokenizer& tok, const std::vector<chat_message>& chat) {
  // Mirrors encode_chat (runtime/ml/formats/tokenizer.cpp) token for token; the tests
  // hold the two equal.
  sft_sequence s;
  auto put = [&](token_id t, bool loss) {
    s.ids.push_back(t);
    s.loss_mask.push_back(loss ? 1 : 0);
  };
  put(tok.special_id(special_token::bos), false);
  for (const chat_message& m : chat) {
    const bool trained = m.role == chat_role::assistant;
    put(tok.special_id(turn_marker(m.role)), false);
    for (const token_id t : tok.encode(m.content)) put(t, trained);
    put(tok.special_id(special_token::end_turn), trained);
  }
  return s;
}

sft_report run_sft(const sft_options& o, const sft_progress_fn& progress) {
  validate(o);
  return run_sft(o, make_task(o.task, o.task_config), progress);
}

sft_report run_sft(const sft_options& o, const any_task& task, const sft_progress_fn& progress) {
  validate(o);
  if (!task.single_turn && !task.multi_turn) throw std::invalid_argument("run_sft: the task is empty");
  const auto start = clock_type::now();
  if (o.threads > 0) at::set_num_threads(o.threads);

  sft_report rep;
  rep.dims = sft_model_dims(o);
  rep.preset = o.dims ? "custom" : o.preset;
  rep.task = std::string(task.name());
  const byte_tokenizer tok;
  // Before the pool is built: a missing starting checkpoint should cost no time.
  std::optional<std::filesystem::path> init_dir;
  if (!o.init_checkpoint.empty()) {
    init_dir = latest_checkpoint(o.init_checkpoint);
    if (!init_dir)
      throw std::invalid_argument(fmt::format(
          "run_sft: init_checkpoint {} holds no checkpoint (no 'latest' file); write it first "
          "(`sorl sft` on the config whose model.checkpoint it is)", o.init_checkpoint));
  }

  // -- the demonstration pool ------------------------------------------------------------
  std::vector<sft_sequence> pool;
  const auto fresh = static_cast<std::uint64_t>(o.steps * o.batch_size);
  if (task.single_turn) {
    const std::optional<std::uint64_t> size = task.single_turn->size(task_split::train);
    std::uint64_t n = o.pool_size > 0 ? static_cast<std::uint64_t>(o.pool_size) : fresh;
    if (size) {
      if (*size == 0) throw std::invalid_argument("run_sft: the task's train split is empty");
      n = o.pool_size > 0 ? std::min(n, *size) : *size;
    }
    const auto demos = make_demonstrations(*task.single_turn, task_split::train, 0, n, o.wrong_fraction, o.seed);
    pool.reserve(demos.size());
    for (const demonstration& d : demos) {
      pool.push_back(encode_demonstration(tok, d));
      rep.wrong_in_pool += d.correct ? 0 : 1;
    }
  } else {
    const std::uint64_t n = o.pool_size > 0 ? static_cast<std::uint64_t>(o.pool_size) : fresh;
    const auto eps = make_episode_demonstrations(*task.multi_turn, task_split::train, 0, n, o.wrong_fraction, o.seed);
    pool.reserve(eps.size());
    for (const episode_demonstration& e : eps) {
      pool.push_back(encode_episode(tok, e.chat));
      rep.wrong_in_pool += e.correct ? 0 : 1;
    }
  }
  rep.pool_size = static_cast<std::int64_t>(pool.size());
  for (std::size_t i = 0; i < pool.size(); ++i)
    if (static_cast<std::int64_t>(pool[i].ids.size()) > rep.dims.max_seq)
      throw std::invalid_argument(fmt::format(
          "run_sft: demonstration {} has {} tokens, more than the model's max_seq ({})", i,
          pool[i].ids.size(), rep.dims.max_seq));

  // -- model, optimiser, evaluation ------------------------------------------------------
  policy_model model(rep.dims, o.seed, o.init_std);
  // load_checkpoint checks every tensor's name, dtype and shape before it copies any.
  if (init_dir) load_checkpoint(*init_dir, model.parameters());
  model.set_requires_grad(true);
  adamw opt(model.parameters(), o);
  batch_order order(pool.size(), o.seed);
  std::vector<std::int64_t> lengths(pool.size());
  for (std::size_t i = 0; i < pool.size(); ++i) lengths[i] = static_cast<std::int64_t>(pool[i].ids.size());
  length_grouped_order batches(order, lengths, static_cast<std::size_t>(o.batch_size),
                               static_cast<std::size_t>(o.group_by_length));

  eval_options eo;
  eo.split = task_split::eval;
  eo.count = o.eval_count;
  eo.max_new_tokens = o.eval_max_new_tokens;
  eo.batch = o.eval_batch;
  eo.greedy = true;
  auto run_eval = [&]() { return evaluate(model, tok, task, eo); };

  sft_progress pr;
  pr.steps = o.steps;
  if (o.eval_count > 0 && o.eval_before) {
    rep.before = run_eval();
    if (progress) {
      pr.elapsed_seconds = seconds_since(start);
      pr.eval = &*rep.before;
      progress(pr);
      pr.eval = nullptr;
    }
  }

  // -- training --------------------------------------------------------------------------
  const token_id pad = tok.special_id(special_token::pad);
  rep.losses.reserve(static_cast<std::size_t>(o.steps));
  for (std::int64_t step = 0; step < o.steps; ++step) {
    const auto t0 = clock_type::now();
    const train_batch b = make_batch(pool, batches.next(), pad);
    const at::Tensor logits = model.forward(b.inputs, b.attention);            // [B, T, V]
    const at::Tensor logp = at::log_softmax(logits, -1);
    const at::Tensor nll = -logp.gather(-1, b.targets.unsqueeze(-1)).squeeze(-1);  // [B, T]
    const at::Tensor loss = (nll * b.loss_mask).sum() / std::max<std::int64_t>(1, b.loss_tokens);
    loss.backward();
    const double norm = opt.grad_norm();
    // A non-finite norm fails the comparison below and would step every weight to NaN, and
    // the warm start would then save a useless checkpoint as if it had worked.
    if (!std::isfinite(norm) || !std::isfinite(loss.item<double>()))
      throw std::runtime_error(fmt::format(
          "sft step {}: the loss ({}) or the gradient norm ({}) is not finite; lower [sft] lr "
          "(now {}) or check the starting weights",
          step + 1, loss.item<double>(), norm, o.lr));
    const double scale = (o.grad_clip > 0.0 && norm > o.grad_clip) ? o.grad_clip / (norm + 1e-6) : 1.0;
    const double lr = lr_at(o, step);
    opt.step(lr, scale);

    const double l = loss.item<double>();
    rep.losses.push_back(l);
    rep.train_tokens += b.real_tokens;
    rep.loss_tokens += b.loss_tokens;
    rep.train_seconds += seconds_since(t0);
    rep.steps = step + 1;

    pr.step = step + 1;
    pr.loss = l;
    pr.lr = lr;
    pr.grad_norm = norm;
    pr.tokens_per_second = rep.train_seconds > 0.0 ? static_cast<double>(rep.train_tokens) / rep.train_seconds : 0.0;
    const bool periodic = o.eval_count > 0 && o.eval_every > 0 && pr.step % o.eval_every == 0 && pr.step < o.steps;
    if (periodic) rep.during.emplace_back(pr.step, run_eval());
    if (progress) {
      pr.elapsed_seconds = seconds_since(start);
      pr.eval = periodic ? &rep.during.back().second : nullptr;
      progress(pr);
      pr.eval = nullptr;
    }
  }
  model.set_requires_grad(false);
  rep.tokens_per_second = rep.train_seconds > 0.0 ? static_cast<double>(rep.train_tokens) / rep.train_seconds : 0.0;

  if (o.eval_count > 0) {
    rep.after = run_eval();
    if (progress) {
      pr.elapsed_seconds = seconds_since(start);
      pr.eval = &*rep.after;
      progress(pr);
      pr.eval = nullptr;
    }
  }

  // -- checkpoint ------------------------------------------------------------------------
  rep.optimizer_state = opt.state();
  if (!o.output_dir.empty()) {
    checkpoint_state st;
    st.step = opt.steps();
    st.rng_states["sft.data"] = order.rng_state();
    auto& md = st.metadata;
    md["sorl.sft.preset"] = rep.preset;
    md["sorl.sft.task"] = rep.task;
    md["sorl.sft.task_seed"] = std::to_string(o.task_config.seed);
    md["sorl.sft.eval_fraction"] = format_double(o.task_config.eval_fraction);
    md["sorl.sft.wrong_fraction"] = format_double(o.wrong_fraction);
    md["sorl.sft.seed"] = std::to_string(o.seed);
    md["sorl.sft.steps"] = std::to_string(rep.steps);
    md["sorl.sft.batch_size"] = std::to_string(o.batch_size);
    md["sorl.sft.lr"] = format_double(o.lr);
    md["sorl.sft.pool_size"] = std::to_string(rep.pool_size);
    if (init_dir) md["sorl.sft.init_checkpoint"] = init_dir->string();
    md["sorl.sft.final_loss"] = format_double(rep.losses.empty() ? 0.0 : rep.losses.back());
    if (rep.after) {
      md["sorl.sft.eval_accuracy"] = format_double(rep.after->accuracy);
      md["sorl.sft.eval_mean_reward"] = format_double(rep.after->mean_reward);
      md["sorl.sft.eval_count"] = std::to_string(rep.after->count);
    }
    const model_dims& d = rep.dims;
    md["sorl.model.vocab"] = std::to_string(d.vocab);
    md["sorl.model.d_model"] = std::to_string(d.d_model);
    md["sorl.model.n_layers"] = std::to_string(d.n_layers);
    md["sorl.model.n_heads"] = std::to_string(d.n_heads);
    md["sorl.model.n_kv_heads"] = std::to_string(d.n_kv_heads);
    md["sorl.model.d_ff"] = std::to_string(d.d_ff);
    md["sorl.model.max_seq"] = std::to_string(d.max_seq);
    md["sorl.model.rope_theta"] = format_double(d.rope_theta);
    md["sorl.model.norm_eps"] = format_double(d.norm_eps);
    md["sorl.model.tie_embeddings"] = d.tie_embeddings ? "true" : "false";
    md["sorl.model.qkv_bias"] = d.qkv_bias ? "true" : "false";
    rep.checkpoint = save_checkpoint(o.output_dir, model.parameters(), rep.optimizer_state, st, &rep.removed_stale);
  }
  rep.model = std::make_unique<policy_model>(std::move(model));
  rep.total_seconds = seconds_since(start);
  return rep;
}

}  // namespace sorl::ml
