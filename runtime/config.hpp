#pragma once

// Experiment + topology configuration (ARCHITECTURE.md §5): one TOML file, parsed once at the
// entry point into the plain structs below and passed down. Nothing else reads TOML.
//
// Free of CAF: the loader is a pure function from text to structs or a list of errors.

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace sorl {

/// One problem found in a configuration file, located at the line of the offending key
/// (or of its table when the key is missing). Lines and columns are 1-based; 0 = unknown.
struct config_error {
  std::string file;
  int line = 0;
  int column = 0;
  std::string key;     ///< dotted path, e.g. "sagc.g_max" or "node[2].listen"
  std::string message; ///< what is wrong and what is expected

  /// "FILE:LINE:COL: key 'KEY': MESSAGE", the form compilers use so editors can jump to it.
  std::string to_string() const;
};

/// Raised by load_config/parse_config with every error found in the file (at least one).
class config_exception : public std::runtime_error {
public:
  explicit config_exception(std::vector<config_error> errors);
  const std::vector<config_error>& errors() const noexcept {
    return errors_;
  }

private:
  std::vector<config_error> errors_;
};

/// `text` as a TOML basic string: quotes, backslashes and control characters escaped, other
/// bytes (UTF-8) as they are.
std::string toml_quoted(std::string_view text);

/// A TCP endpoint "host:port"; port 0 asks the OS for a free port (listening side only).
struct endpoint {
  std::string host;
  uint16_t port = 0;

  /// True for 127.0.0.0/8, ::1 and "localhost": the only addresses that may be used
  /// without TLS unless `network.insecure = true`.
  bool is_loopback() const;
  std::string to_string() const;
  /// Parses "host:port" or "[v6]:port"; std::nullopt with a reason in `why` otherwise.
  static std::optional<endpoint> parse(std::string_view text, std::string* why = nullptr);
};

/// The enumerated settings: each is parsed once, here, from its config spelling; roles map
/// them onto their own options (`*_options_from` next to each role's core), never re-reading
/// the string. `config_names<E>::values` lists each value with its spelling, in the order error
/// messages name them; `to_string` gives the spelling back (config.resolved.toml, messages).
enum class algorithm_kind { grpo, dapo };               ///< [algorithm].name
enum class overlong_kind { none, filter, shape };       ///< [algorithm].overlong
enum class reward_failure_kind { mask, fail };          ///< [algorithm].on_reward_failure
enum class loss_norm_kind { token, sequence };          ///< [algorithm].loss_norm
enum class learner_weights_kind { bf16, fp32 };         ///< [algorithm].learner_weights
enum class old_logprobs_kind { rollout, recompute };    ///< [algorithm].old_logprobs
enum class group_policy_kind { fixed, sagc, deadline }; ///< [sagc].policy; `fixed` is "static"
/// [sagc].straggler_rule (actors/sagc/timing.hpp straggler_rule).
enum class straggler_rule_kind { wall_clock, group_tokens };
enum class sync_kind { full, sparse };                  ///< [sync].mode
/// [scheduler].policy (actors/scheduler/placement.hpp placement_policy).
enum class placement_kind { round_robin, least_loaded, cache_aware, sglang_cache_aware };
enum class match_kind { exact, integer, first_number, last_number, countdown }; ///< [task].match
/// [salt].gram (actors/learner/grad_gram.hpp gram_method).
enum class salt_gram_kind { automatic, ghost, materialized };
enum class kernels_kind { native, portable }; ///< [run].kernels (runtime/ml/policy/cpu_kernels.hpp)

template <class E>
struct config_names {};

#define SORL_CONFIG_NAMES(E, N, ...)                                                              \
  template <>                                                                                 \
  struct config_names<E> {                                                                    \
    static constexpr std::array<std::pair<E, std::string_view>, N> values{{__VA_ARGS__}};     \
  };
SORL_CONFIG_NAMES(algorithm_kind, 2, {algorithm_kind::grpo, "grpo"}, {algorithm_kind::dapo, "dapo"})
SORL_CONFIG_NAMES(overlong_kind, 3, {overlong_kind::none, "none"},
                  {overlong_kind::filter, "filter"}, {overlong_kind::shape, "shape"})
SORL_CONFIG_NAMES(reward_failure_kind, 2, {reward_failure_kind::mask, "mask"},
                  {reward_failure_kind::fail, "fail"})
SORL_CONFIG_NAMES(loss_norm_kind, 2, {loss_norm_kind::token, "token"},
                  {loss_norm_kind::sequence, "sequence"})
SORL_CONFIG_NAMES(learner_weights_kind, 2, {learner_weights_kind::bf16, "bf16"},
                  {learner_weights_kind::fp32, "fp32"})
SORL_CONFIG_NAMES(old_logprobs_kind, 2, {old_logprobs_kind::rollout, "rollout"},
                  {old_logprobs_kind::recompute, "recompute"})
SORL_CONFIG_NAMES(group_policy_kind, 3, {group_policy_kind::fixed, "static"},
                  {group_policy_kind::sagc, "sagc"}, {group_policy_kind::deadline, "deadline"})
SORL_CONFIG_NAMES(straggler_rule_kind, 2, {straggler_rule_kind::wall_clock, "wall_clock"},
                  {straggler_rule_kind::group_tokens, "group_tokens"})
SORL_CONFIG_NAMES(sync_kind, 2, {sync_kind::full, "full"}, {sync_kind::sparse, "sparse"})
SORL_CONFIG_NAMES(placement_kind, 4, {placement_kind::round_robin, "round_robin"},
                  {placement_kind::least_loaded, "least_loaded"},
                  {placement_kind::cache_aware, "cache_aware"},
                  {placement_kind::sglang_cache_aware, "sglang_cache_aware"})
SORL_CONFIG_NAMES(salt_gram_kind, 3, {salt_gram_kind::automatic, "auto"}, {salt_gram_kind::ghost, "ghost"},
                  {salt_gram_kind::materialized, "materialized"})
SORL_CONFIG_NAMES(match_kind, 5, {match_kind::exact, "exact"}, {match_kind::integer, "integer"},
                  {match_kind::first_number, "first_number"},
                  {match_kind::last_number, "last_number"}, {match_kind::countdown, "countdown"})
SORL_CONFIG_NAMES(kernels_kind, 2, {kernels_kind::native, "native"},
                  {kernels_kind::portable, "portable"})
#undef SORL_CONFIG_NAMES

/// The config spelling of an enumerated setting, e.g. to_string(sync_kind::sparse) == "sparse".
template <class E, class = decltype(config_names<E>::values)>
std::string_view to_string(E value) {
  for (const auto& item : config_names<E>::values)
    if (item.first == value)
      return item.second;
  return "?";
}

/// [run]: identity and length of the experiment.
struct run_config {
  std::string name = "sorl";
  uint64_t seed = 0;
  int64_t steps = 100;           ///< synchronous RL steps
  std::string output_dir = "runs"; ///< relative paths resolve against the working directory
  int64_t checkpoint_every = 10;   ///< steps between checkpoints; 0 = only at the end
  /// steps between greedy held-out evaluations during the run (veRL's test_freq), on
  /// task.eval_prompts prompts after the step's weight sync; 0 = only before the first step
  /// and after the last. Range 0..1e8.
  int64_t eval_every = 0;
  /// Greedy held-out accuracy, in [0, 1], at which the run ends early: after the first
  /// evaluation every eval_every steps whose accuracy is ≥ it, the run checkpoints and stops
  /// as if run.steps ended there (that evaluation is its "after"). 0 = run every step. Needs
  /// eval_every > 0 and task.eval_prompts > 0.
  double stop_at_accuracy = 0.0;
  /// libtorch intra-op threads per process. 1 suits CPU runs where the learner and the
  /// rollout workers share the cores; 0 leaves libtorch's default (one per core).
  int64_t threads = 1;
  /// CPU kernels of the processes that train or decode (runtime/ml/policy/cpu_kernels.hpp):
  /// "native" = each library's own, fastest choice for the CPU, whose rounding differs between
  /// machines (AVX2 or AVX-512) and so, after many steps, does the model; "portable" = libtorch,
  /// oneDNN and OpenBLAS held to their AVX2 kernels, the same bits on any x86-64 CPU with AVX2
  /// and FMA, slower on one with AVX-512 (docs/reproducibility.md). The
  /// environment variable SORL_NATIVE_KERNELS makes "portable" native.
  kernels_kind kernels = kernels_kind::native;
  /// libtorch device of the learner (model, optimizer, loss) and, unless [rollout] device
  /// names another, of the rollout workers (policy, KV cache, sampler): "cpu", "cuda" (CUDA
  /// device 0) or "cuda:N". A CUDA device needs sorl built against a CUDA libtorch
  /// (scripts/build-torch2, ARCHITECTURE.md §8); a role started without one fails naming
  /// this key.
  std::string device = "cpu";
  /// Continue from the latest checkpoint in the run directory (set by `sorl train --resume`,
  /// not read from the file).
  bool resume = false;

  /// output_dir/name: where metrics.jsonl, checkpoints/ and plots/ go.
  std::string run_dir() const {
    return output_dir + "/" + name;
  }
};

/// [model]: which policy to build or load.
struct model_config {
  std::string preset = "tiny";    ///< "tiny" | "tiny-2k" (tiny, 2048-token context) | "50m"
  /// A Hugging Face model directory (config.json, safetensors, tokenizer.json with a
  /// recognised chat template; runtime/ml/formats/hf_model.hpp,
  /// runtime/ml/formats/prompt_format.hpp) to start from instead of a preset: its shape, weights
  /// (unless `checkpoint` or --resume name a sorl checkpoint) and prompt format. Single-turn tasks
  /// only. Relative to the config file.
  std::string hf_dir;
  /// With hf_dir: the longest sequence (prompt + response) the policy may hold, tokens; 0 =
  /// the model's max_position_embeddings, capped at 32768. Range 0..2^20.
  int64_t max_seq = 0;
  /// Checkpoint root (a directory of step-N checkpoints, runtime/ml/formats/checkpoint.hpp) to
  /// start from; empty = random init from the preset. Relative to the config file.
  std::string checkpoint;
  /// When `checkpoint` holds no checkpoint yet, create it with the warm start ([sft]) first.
  bool warm_start = false;
  std::string rollout_dtype = "bf16"; ///< dtype of the rollout workers' weights: "bf16" | "fp32"
};

/// [task]: the verifiable-reward task or multi-turn environment (runtime/ml/tasks/tasks.hpp).
struct task_config {
  std::string name = "arithmetic"; ///< "arithmetic" | "number_guess" | "file_search" | "jsonl"
  std::string path;                ///< JSONL prompts (name = "jsonl"), relative to the config file
  std::string eval_path;           ///< optional held-out JSONL
  /// jsonl answer match: "exact" | "integer" | "first_number" | "last_number" | "countdown" (reasoning-gym's
  /// rules, on the text of the completion's last <answer> tag when it has one;
  /// runtime/ml/tasks/tasks.hpp answer_match)
  match_kind match = match_kind::exact;
  /// jsonl: a scorer process that rewards completions instead of `match` (protocol:
  /// runtime/ml/tasks/reward_process.hpp), e.g. [".venv-data/bin/python",
  /// "scripts/rewards/reasoning_gym_reward.py"]. Run without a shell in sorl's working
  /// directory; an argument is taken as written (not relative to the config file). argv[0]
  /// must be a program that can be started (a path, or a name in PATH). Empty = off.
  std::vector<std::string> reward_command;
  int64_t reward_timeout_ms = 30000; ///< per scoring call, ms; 1..3.6e6
  /// With model.hf_dir: a system message before every prompt ("" = none).
  std::string system_prompt;
  int64_t min_digits = 1;          ///< arithmetic operand digits
  int64_t max_digits = 2;
  std::string operators = "+";     ///< arithmetic: non-empty subset of "+-*/"
  bool allow_negative = true;
  /// arithmetic: what the warm start's wrong demonstrations answer: "near" (the result
  /// shifted by 1..10) | "dropped_carry" (additions that carry, with the carries dropped;
  /// other problems stay correct)
  std::string wrong_answers = "near";
  int64_t lo = 1;                  ///< number_guess: hidden number range
  int64_t hi = 100;
  int64_t max_turns = 10;          ///< number_guess, file_search: actions per episode, 1..65536
  int64_t depth = 2;               ///< file_search: directory levels below "/" (key at the deepest), 1..4
  int64_t max_dirs = 2;            ///< file_search: subdirectories per directory, 1..max_dirs; 1..8
  int64_t max_files = 2;           ///< file_search: files per directory, 1..max_files; 1..8
  /// file_search: transcript budget per episode, tokens (64..2^30). Keep it at most the
  /// model's max_seq minus max_new_tokens: a longer episode is cut by the rollout's context
  /// ("context full", finish reason length), and `sorl sft` refuses longer demonstrations.
  int64_t max_episode_tokens = 1536;
  double detour_rate = 0.1;        ///< file_search: expert demonstrations' detour probability per action, [0, 1]
  /// file_search: what the warm start's wrong demonstrations do: "wander" (ignore the tree)
  /// | "give_up" (the expert, answering "not found" after the first deepest directory
  /// it searched in vain)
  std::string wrong_episodes = "wander";
  /// file_search with "give_up": share of the wrong demonstrations that wander instead
  /// (answering "not found" when they answer), [0, 1]; must be 0 with "wander"
  double wander_share = 0.0;
  /// file_search: bytes of per-family documentation opening each episode's first
  /// observation, 0..65536 (0 = none); the episode's seed picks one of preamble_families
  /// texts (runtime/ml/tasks/tasks.hpp file_search_options)
  int64_t preamble_bytes = 0;
  int64_t preamble_families = 16;  ///< file_search: distinct preambles, 1..65536
  double eval_fraction = 0.1;      ///< share of the problem space held out
  int64_t max_new_tokens = 16;     ///< per turn, tokens
  int64_t eval_prompts = 200;      ///< held-out prompts for greedy evaluation
};

/// [sft]: the supervised warm start (`sorl sft`, runtime/ml/train/sft.hpp).
struct sft_config {
  int64_t steps = 600;
  int64_t batch_size = 32;
  double lr = 2e-3;
  int64_t warmup_steps = 50;
  double wrong_fraction = 0.2;     ///< share of deliberately wrong demonstrations
  int64_t eval_count = 200;        ///< held-out prompts evaluated before and after
  /// Batches of similar lengths from sorted windows of this many batches; 0 = off
  /// (runtime/ml/train/sft.hpp, sft_options::group_by_length).
  int64_t group_by_length = 0;
  /// Start from the weights of this sorl checkpoint root (its `latest` step, as
  /// `model.checkpoint` is laid out) instead of a fresh initialisation, e.g. to adapt a warm
  /// start to a changed task; the optimizer starts fresh. Relative to the config file; ""
  /// (default) = fresh weights. Must exist when `sorl sft` runs and match the preset's shapes.
  std::string init_checkpoint;
};

/// [algorithm]: GRPO / DAPO hyper-parameters (ARCHITECTURE.md §6).
struct algorithm_config {
  /// "grpo" | "dapo"; "dapo" changes the defaults of clip_eps_high (0.28), dynamic_sampling
  /// (true), overlong ("shape") and loss_norm ("token") for keys the file does not set.
  algorithm_kind name = algorithm_kind::grpo;
  int64_t prompts_per_step = 8;   ///< B
  bool dynamic_sampling = false;  ///< DAPO: drop zero-signal groups and refill
  int64_t max_refill_rounds = 3;
  /// truncated responses: "none" | "filter" | "shape" (DAPO)
  overlong_kind overlong = overlong_kind::none;
  /// DAPO soft overlong punishment interval, tokens. Shaping is per turn: a multi-turn
  /// episode gets the penalty of its longest turn against max_new_tokens (learner_core.hpp).
  int64_t overlong_cache = 4;
  /// A rollout whose reward failed (the scorer threw, or a NaN / inf reward): "mask" leaves it
  /// out of its group's statistics and the loss and counts it in `reward_failures`; "fail"
  /// stops the job at that step, naming the rollout.
  reward_failure_kind on_reward_failure = reward_failure_kind::mask;
  int64_t epochs = 1;             ///< passes over the batch per step
  int64_t minibatches = 1;        ///< optimizer steps per pass
  /// Minibatches hold whole groups (shuffled and split by group) instead of single rollouts,
  /// so that a group's advantages sum to 0 in its minibatch. No effect with one minibatch.
  bool group_minibatches = false;
  /// Bound on one learner forward, padded tokens (rows × longest prompt + response), >= 0;
  /// 0 = none. Larger minibatches run as micro-batches of similar-length rows whose
  /// gradients add up to the minibatch's (actors/learner/learner_core.hpp).
  int64_t micro_batch_tokens = 4096;
  /// AdamW learning rate, in [0, 1]; 0 = a frozen policy (rollouts, rewards and loss metrics
  /// of the starting weights, which never change: a baseline on the same prompts and seeds).
  double lr = 1e-4;
  double clip_eps_low = 0.2;      ///< in [0, 1)
  double clip_eps_high = 0.2;     ///< DAPO clip-higher uses e.g. 0.28
  double kl_coef = 0.0;           ///< 0 disables the reference model
  loss_norm_kind loss_norm = loss_norm_kind::token; ///< "token" | "sequence"
  bool scale_advantages = true;   ///< divide by the group's std (false = Dr. GRPO)
  double max_grad_norm = 1.0;
  double weight_decay = 0.0;      ///< in [0, 1], with lr × weight_decay < 1
  /// 0 = greedy, else in [0.01, 100] (ml::min_temperature: smaller ones overflow fp32).
  /// Sampling parameters travel as doubles to the sampler, so 0.8 is compared as 0.8.
  double temperature = 1.0;
  double top_p = 1.0;             ///< nucleus mass in [0, 1]; 1 = off
  int64_t top_k = 0;              ///< 0 = off
  /// Which weights the learner's forward and backward see: "bf16" = the bf16 image of the
  /// fp32 master that the rollout workers sample with, bit for bit, the gradient applied to
  /// the master (exactly on-policy); "fp32" = the master itself, which drifts below half a
  /// bf16 ulp from what the rollouts sample: kept only to measure that drift
  /// (actors/learner/learner_core.hpp forward_weights).
  learner_weights_kind learner_weights = learner_weights_kind::bf16;
  /// π_old of the importance ratio: "recompute" (default) = a no-grad learner forward over the
  /// batch before the first update, skipped when the one update's forwards double as it;
  /// "rollout" = the worker's own sampling log-probs, for every epoch and minibatch, with no
  /// recompute pass. With learner_weights = "bf16" the two agree to ~1e-5 nats, but the
  /// rollout's last bits depend on the workers' batching, so "rollout" gives up bit-for-bit
  /// reproducible runs (resume, TLS or sparse sync against full) to save that pass
  /// (actors/learner/learner_core.hpp old_logprob_source; docs/exactly-on-policy.md).
  old_logprobs_kind old_logprobs = old_logprobs_kind::recompute;
  /// Truncated importance sampling for rollout kernels that differ from the learner's (a GPU
  /// build, say): each token's policy-gradient term weighted by min(π_old / π_rollout,
  /// tis_cap); 0 = off (default), else >= 1 (2 is veRL's and slime's default); needs
  /// old_logprobs = "recompute".
  double tis_cap = 0.0;
  /// A step whose mean |learner − rollout log-prob| (metric mismatch_mean) exceeds this many
  /// nats logs a warning (the first time) and is counted (metric mismatch_alarms); > 0.
  /// Exact rollouts sit near 1e-5; peers' GPU kernels near 1e-2.
  double mismatch_warn = 1e-3;
  /// Not a key: the keys `name`'s preset set because the file does not (runtime/
  /// config_resolved.hpp, preset_summary, reports them at start).
  std::vector<std::string> preset_keys;
};

/// [sagc]: group-size control (ARCHITECTURE.md §6, SAGC).
struct sagc_config {
  group_policy_kind policy = group_policy_kind::fixed; ///< "static" | "sagc" | "deadline"
  int64_t group_size = 8;        ///< G for the static policy and the first step
  int64_t g_min = 2;
  int64_t g_max = 16;
  /// What a straggler is: wall_clock = duration > kappa × the running median of durations;
  /// group_tokens = response tokens > kappa × the median of its own group's. group_tokens is
  /// the default because its verdict does not move with the load (docs/sagc.md, "Two
  /// straggler rules").
  straggler_rule_kind straggler_rule = straggler_rule_kind::group_tokens;
  double kappa = 3.0;            ///< straggler if over kappa × the median straggler_rule names
  double target_rate = 0.1;      ///< ε, long-run straggler-event rate
  int64_t window = 256;          ///< rollouts in the running statistic
  double v = 10.0;               ///< sagc: penalty weight V of drift-plus-penalty
  double deadline_kappa = 3.0;   ///< deadline: rollout budget = deadline_kappa × window median
};

/// [salt]: subspace-adaptive coefficients (ARCHITECTURE.md §6, SALT; the formulation is in
/// actors/learner/salt.hpp, the Gram matrix in actors/learner/grad_gram.hpp).
struct salt_config {
  bool enabled = false;          ///< reweight each minibatch's advantages (off = plain GRPO / DAPO)
  double eta = 0.9;              ///< energy share of the dominant ("shared") subspace, (0, 1]
  double beta = 1.0;             ///< amplification slope of the residual channel, >= 0
  double c0 = 0.5;               ///< cancellation c below which the residual channel is amplified, > 0
  double gamma_max = 3.0;        ///< bound on the amplification γ, >= 1
  int64_t layers = 0;            ///< last decoder layers whose linear layers enter K besides the LM head (0 = the LM head only); -1 = all
  salt_gram_kind gram = salt_gram_kind::automatic; ///< "auto" | "ghost" | "materialized"
};

/// [sync]: learner → rollout weight synchronisation (ARCHITECTURE.md §6, SparseRL-Sync).
struct sync_config {
  sync_kind mode = sync_kind::sparse; ///< "sparse" (bit-exact bf16 deltas) | "full"
  int64_t bucket_bytes = 64ll << 20; ///< bytes per bucket, 4096..2^29 (an envelope is ≤ 1 GiB)
  int64_t full_every = 0;        ///< a full anchor every N versions; 0 = never forced
};

/// [rollout]: rollout workers.
struct rollout_config {
  int64_t max_batch = 64;        ///< sequences decoded together per worker
  int64_t chunk_tokens = 16;     ///< a timing chunk message every N generated tokens; 0 = off
  /// Prefix KV cache per worker, bytes of fp32 KV (runtime/ml/policy/prefix_cache.hpp): whole
  /// 16-token blocks of earlier prompts and finished turns of the current weights, reused
  /// by later prompts that start the same way, least recently used evicted first; a weight
  /// update drops it. 0 = off. 0..2^40.
  int64_t prefix_cache_bytes = 256ll << 20;
  /// Suffix speculative decoding (ARCHITECTURE.md §6 WAR): "off"; "on" (drafts of up to
  /// draft_max_tokens); "auto" = per batch size, whichever of off and drafts of up to
  /// draft_max_tokens, half and a quarter of it measured fastest
  /// (actors/rollout/speculation_switch.hpp).
  /// Rollouts are the same tokens either way (runtime/ml/policy/generate.hpp).
  std::string speculative = "off";
  int64_t draft_max_tokens = 16;      ///< longest draft per sample and step, tokens, 1..256
  /// A draft stops where the product of its tokens' frequencies in the suffix tree falls
  /// below this, [0, 1].
  double draft_min_token_prob = 0.1;
  /// A suffix match of m tokens allows drafts of floor(m * factor) tokens, [0, 64].
  double draft_spec_factor = 1.0;
  int64_t suffix_max_depth = 32;      ///< longest indexed substring of the suffix trees, tokens, 2..256
  /// Bound on the global suffix tree of finished responses, bytes (per worker: its own and,
  /// with a suffix_index_keeper in the topology, the other workers'); the oldest responses
  /// are evicted past it; 0 = group trees only. 0..2^40.
  int64_t suffix_global_bytes = 64ll << 20;
  /// s: the longest the trainer waits, in a step's rollout phase, for the next finished
  /// rollout (or the group-size decision) before it fails the job, naming the request ids,
  /// groups and samples still missing; > 0.
  double watchdog_s = 600.0;
  /// The rollout workers' device, spelled as run.device; "" = run.device. Lets the policy
  /// that generates sit on another GPU than the one that learns.
  std::string device;
};

/// [scheduler]: request placement.
struct scheduler_config {
  /// "round_robin" | "least_loaded" | "cache_aware" | "sglang_cache_aware" (SGLang router's
  /// rule, a baseline for bench/)
  placement_kind policy = placement_kind::round_robin;
  /// Requests (load units): group affinity yields to the least loaded worker past this load
  /// difference, and under cache_aware a worker with nothing in flight takes a group's first
  /// request past it whatever the cache says. 1..1e6.
  double imbalance_threshold = 2.0;
  /// cache_aware: the least share of a prompt its longest estimated cached prefix on a worker
  /// must cover to decide the placement; 0..1.
  double cache_threshold = 0.3;
  /// Requests (load units): cache_aware's prefix yields to the least loaded worker past this
  /// load difference; 0..1e6.
  double cache_imbalance_threshold = 64.0;
};

/// [network]: how nodes connect and how failures are detected.
struct network_config {
  /// BASP heartbeat period, ms. With connection_timeout_ms it bounds how long a silent
  /// (frozen or partitioned) node goes unnoticed; a killed process is seen at once (FIN/RST).
  int64_t heartbeat_ms = 250;
  int64_t connection_timeout_ms = 2000;
  int64_t connect_timeout_ms = 15000; ///< how long a connecting node retries reaching the hub
  int64_t join_timeout_ms = 60000;    ///< how long the hub waits for every node to join
  /// Once the job has ended, how long the hub waits for every actor to stop before it stops
  /// waiting and names the ones that did not, ms.
  int64_t stop_grace_ms = 10000;
  bool insecure = false;              ///< allow non-loopback listen/connect without TLS
  std::string tls_certificate;        ///< PEM, relative paths resolve against the config file
  std::string tls_key;
  std::string tls_ca_file;
  std::string tls_passphrase;

  bool tls_enabled() const {
    return !tls_certificate.empty();
  }
  /// Why plaintext to `ep` is refused, e.g. "refusing to connect to non-loopback address
  /// 10.0.0.2:4242 without TLS: set ...", or "" when it is allowed (loopback, TLS configured,
  /// or `insecure`). `verb` is "listen on" or "connect to". The same rule for both sides
  /// (docs/machines.md, "TLS").
  std::string plaintext_refusal(const endpoint& ep, std::string_view verb) const;
};

/// [smoke]: the ping/pong roles of configs/smoke.toml (topology smoke run).
struct smoke_config {
  int64_t rounds = 20;
  int64_t interval_ms = 10;   ///< pause between rounds
  int64_t payload_bytes = 64; ///< filler carried by each ping
};

/// One entry of a node's `actors` list: `"role"` or `{ role = "...", count = N }`.
struct role_spec {
  std::string role;
  int64_t count = 1;
  int line = 0;
};

/// One [[node]]: a process (or, under `sorl train`, a part of the single process).
struct node_config {
  std::string name;
  std::optional<endpoint> listen; ///< set on the hub node, which publishes the directory
  std::string connect;            ///< node to connect to; defaults to the only listening node
  std::vector<role_spec> actors;
  int line = 0;
};

/// The whole experiment file.
struct experiment_config {
  std::string file; ///< path it was loaded from ("<string>" for parse_config)
  run_config run;
  model_config model;
  task_config task;
  sft_config sft;
  algorithm_config algorithm;
  sagc_config sagc;
  salt_config salt;
  sync_config sync;
  rollout_config rollout;
  scheduler_config scheduler;
  network_config network;
  smoke_config smoke;
  std::vector<node_config> nodes;
  /// The `--set TABLE.KEY=VALUE` overrides applied over the file, in the order given, as
  /// written on the command line (parse_config); config.resolved.toml names them.
  std::vector<std::string> overrides;

  /// The node with `listen`, or nullptr (single-node files need none).
  const node_config* hub() const;
  const node_config* find_node(std::string_view name) const;
  /// Number of actors of `role` over all nodes.
  int64_t count_role(std::string_view role) const;
};

/// Parses TOML text. `known_roles` is the set of role names the topology can spawn, so an
/// unknown role is reported with its line. `base_dir` resolves relative input paths.
/// Raises config_exception listing every error (syntax, unknown key, wrong type, value out
/// of range, duplicate node name, unknown role, non-loopback address without TLS).
///
/// `overrides` (`sorl ... --set TABLE.KEY=VALUE`, applied in order, a later one of the same
/// key winning) go into the parsed file before any key is read, so each is checked as the same
/// line in the file would be: types, ranges, unknown keys with their hints, presets, and
/// relative paths resolved against `base_dir`. VALUE is a TOML value (`20`, `1e-5`, `true`,
/// `"x"`, `["a", "b"]`); one that is not TOML and does not start with `"`, `'`, `[` or `{` is
/// taken as a string (`native`, `runs/x`). `node.NAME.KEY=VALUE` sets KEY of the [[node]]
/// named NAME; nodes are not added or removed this way, and `node.KEY` alone is refused. An
/// error in or caused by an override names the override instead of a line of the file:
/// "--set algorithm.lr=abc: key 'algorithm.lr': expected a number, got a string".
experiment_config parse_config(std::string_view text, const std::string& file,
                               const std::set<std::string>& known_roles,
                               const std::string& base_dir = ".",
                               const std::vector<std::string>& overrides = {});

/// The kind of value a key takes, as the configuration reference names it (to_string).
enum class config_type {
  integer,
  number,      ///< a float; an integer is accepted too
  boolean,
  string,
  string_list, ///< an array of strings
  choice,      ///< a string, one of config_key::choices
  table,       ///< a section, e.g. [run]
  table_array, ///< an array of tables, e.g. [[node]]
  role_list    ///< [[node]] actors: role names or { role = "...", count = N } tables
};

/// "integer", "number", "boolean", "string", "string list", "choice", "table",
/// "array of tables" or "roles".
std::string_view to_string(config_type type);

/// A value of the configuration reference: a default or a bound. std::monostate = none.
using config_value =
  std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<std::string>>;

/// One key of the experiment file as the parser reads it (runtime/config.cpp): recorded by
/// the very reader call that parses and checks the key, so the reference (docs/config.md,
/// `sorl config`, runtime/config_reference.hpp) cannot drift from the code.
struct config_key {
  /// The table the key sits in: "" = the top level (the sections and "node"), "run", ...,
  /// "node" (a [[node]]), "node.actors" (an actors entry { role = ..., count = ... }).
  std::string table;
  std::string key;
  config_type type = config_type::string;
  /// What the parser leaves when the file omits the key (the struct field's value when the
  /// key is read); std::monostate for a key with none (one the file must set, or one whose
  /// absence means something no value says, as `listen`'s does).
  config_value default_value;
  /// For a key without a default: a value to show, as TOML text (e.g. "\"main\"").
  std::string example;
  bool required = false;    ///< the parser refuses a table that omits it
  config_value lo;          ///< least value accepted (integer and number keys); none = unbounded
  config_value hi;          ///< greatest value accepted; none = unbounded
  bool lo_open = false;     ///< lo itself is refused: (lo, hi]
  std::vector<std::string> choices; ///< a choice's spellings, in the order errors name them
  std::string meaning;      ///< one line, with the unit
};

/// Every key and section of the experiment file in the order the parser reads them: each
/// section's entry (table "") before its keys, `node` and its keys last. Read off the parser
/// by running it once over an empty probe; built on first use, then shared (thread-safe).
const std::vector<config_key>& config_keys();

/// The keys each table accepts, read off the parser itself: "" holds the top-level names
/// (sections and "node"), "node" the keys of a [[node]], "node.actors" those of an actors
/// entry `{ role = ..., count = ... }`, every other entry a section's keys (config_keys() by
/// table). An unknown key is reported with the nearest of these ("did you mean `temperature`
/// in [algorithm]?").
const std::map<std::string, std::set<std::string>>& known_config_keys();

/// Names other RL trainers (TRL, OpenRLHF, veRL) use for a setting sorl calls otherwise,
/// lower case → (table, sorl key), e.g. "learning_rate" → ("algorithm", "lr"). An unknown key
/// with such a name gets that key as its hint: these are not typos, edit distance misses them.
const std::map<std::string, std::pair<std::string, std::string>>& peer_config_names();

/// Reads and parses a file; a missing or unreadable file is a config_exception too.
/// Every file-system problem of a configured path (missing, too long a name, no permission,
/// a symlink loop, a file where a directory belongs) is a config_error at its key.
/// `overrides` as for parse_config.
experiment_config load_config(const std::string& path,
                              const std::set<std::string>& known_roles,
                              const std::vector<std::string>& overrides = {});

} // namespace sorl
