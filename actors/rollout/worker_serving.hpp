#pragma once

// The rollout worker's serving rules, free of CAF (ARCHITECTURE.md §3 step 3): which requests
// it serves given the weights it holds, what a decoding failure does to the rollouts it
// holds, where its timing events go, and how its weight receiver sees the model. The shell
// (worker_actor.cpp) decodes the messages, calls these and sends what they return.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/rollout/worker_core.hpp"
#include "actors/sync/weight_sync.hpp"
#include "runtime/sync/delta_codec.hpp"

namespace sorl::rollout {

/// Why a worker holding weights version `held` refuses a request for version `wanted`, or
/// std::nullopt when the versions are equal. `held` is sync::weight_receiver::no_version
/// before the first version is applied (and after a delta failed its hash check).
std::optional<std::string> version_refusal(uint64_t held, uint64_t wanted);

/// What admit() did with a request.
struct admission {
  bool held = false;    ///< the core holds it now, to serve or to answer as refused
  std::string refusal;  ///< why it is refused (version_refusal); empty when served
  std::string error;    ///< why it was not taken (a request id already held); empty when held
};

/// Takes `req` into `core`: enqueued when the worker holds the version it wants (`held`),
/// else rejected (worker_core::reject) with version_refusal's reason, so that it still comes
/// back, as a failed rollout, and its step completes without it. A request id already held
/// is not taken (`error`): the rollout in flight answers for it.
admission admit(worker_core& core, const rollout_request& req, uint64_t held);

/// One turn of the worker's decoding loop.
struct tick_result {
  std::vector<rollout_result> results; ///< for the trainer, in order
  /// The generator threw (what it said): `results` then hold every rollout the worker held
  /// (abort_after_decode_failure), and the worker must leave the job.
  std::optional<std::string> failure;
};

/// Advances the rollouts of `core` by one step (worker_core::step); a step that throws is a
/// decoding failure of `worker` (abort_after_decode_failure). The core's timing events of
/// either case wait in worker_core::take_events().
tick_result decode_tick(worker_core& core, const std::string& worker);

/// After the generator threw (`what`) in worker_core::step(): its state is unknown, so every
/// rollout held comes back (worker_core::abort_all), and those the failure cut become failed
/// (mark_cut_by_failure).
std::vector<rollout_result> abort_after_decode_failure(worker_core& core,
                                                       const std::string& worker,
                                                       const std::string& what);

/// Marks the rollouts of `held` (worker_core::abort_all's results) that the decoding failure
/// cut, i.e. aborted while still ok: status failed, `failure` and `reward_reason` =
/// "decoding failed on <worker>: <what>". Rollouts that finished or failed before the error
/// are kept as they are, so a finished one is still trained on.
void mark_cut_by_failure(std::vector<rollout_result>& held, const std::string& worker,
                         const std::string& what);

/// A peer a rollout event goes to.
enum class event_peer { sagc_controller, scheduler, trainer };

/// Where a timing event of `kind` goes, in sending order: every event to the SAGC controller
/// (timing, stragglers) and the scheduler (load), a start event also to the trainer, whose
/// rollout-phase watchdog names the worker of each rollout it still waits for.
std::vector<event_peer> event_destinations(event_kind kind);

/// The model as the worker's weight receiver (actors/sync/weight_receiver.hpp) sees it:
/// every parameter in model order, as an expected tensor (name, shape, bf16, hash 0) and as
/// a delta target (tensor id = index, the parameter's bf16 bits, its element count).
struct receiver_layout {
  std::vector<sync::tensor_meta> expected;
  std::vector<sync::delta_target> targets; ///< borrow the parameters' memory
};

/// The receiver's layout of `weights`, the rollout weights the sync path writes
/// (worker_core::sync_targets()). Raises std::logic_error naming a tensor that is not
/// contiguous bf16 in host memory.
receiver_layout receiver_layout_of(const std::vector<ml::named_tensor>& weights);

} // namespace sorl::rollout
