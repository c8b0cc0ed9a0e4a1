#pragma once

// The scheduler's decisions on decoded rollout messages (ARCHITECTURE.md §3 step 2, §5
// peer_down), free of CAF: which worker gets each GenerateRequest, which worker gets which ids
// of an AbortRollouts, which finish events free a slot, and where a lost worker's requests go.
// The shell (scheduler_actor.cpp) only decodes the messages through rollout_wire, calls one
// method and sends what it returns. Placement itself (policies, group affinity, loads) is
// `placement`'s (placement.hpp); this class adds the requests' contents, which a re-placement
// sends again.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "actors/rollout/rollout_types.hpp"
#include "actors/scheduler/placement.hpp"

namespace sorl::scheduler {

/// A request for the shell to send to the rollout worker named `worker`.
struct request_dispatch {
  std::string worker;
  rollout::rollout_request request;
};

/// An AbortRollouts for the rollout worker named `worker`, naming only ids it holds.
struct abort_dispatch {
  std::string worker;
  rollout::abort_request abort;
};

/// What a call asks of the shell, in this order: send `sends` and `aborts`, end the job with
/// each of `failures` (a request no live worker can take), and log `warnings`.
struct dispatch_result {
  std::vector<request_dispatch> sends;
  std::vector<abort_dispatch> aborts;
  std::vector<std::string> failures;
  std::vector<std::string> warnings;
};

/// A request's first prompt as its worker will build it (rollout/worker_core.hpp
/// first_prompt_tokens), token ids; what cache-aware placement matches. May throw: the request
/// is then placed without a prefix to match (its worker reports the problem).
using prompt_fn = std::function<std::vector<int32_t>(const rollout::rollout_request&)>;

/// The scheduler's state: the placement and every request that has not finished, by id.
/// Not thread-safe: called on the scheduler actor's thread only.
class scheduler_core {
public:
  /// Raises std::invalid_argument for invalid options (see `placement::placement`). With a
  /// cache-aware policy, `prompt` gives each request's prompt tokens; without it every
  /// request is placed as if nothing were cached (the least loaded worker).
  explicit scheduler_core(placement_options options = {}, prompt_fn prompt = {});

  /// A rollout worker of the roster joins; a name already live is left alone, so a second
  /// roster changes nothing.
  void join(const std::string& worker);

  /// A GenerateRequest from the trainer: held until its finish event and placed on a worker
  /// (one send). A request id already held is not placed again (a warning); no live worker is
  /// a failure naming the request, which stays held. A request of a newer weight version than
  /// any before clears the cache-aware indexes (the workers drop their prefix caches then).
  dispatch_result submit(const rollout::rollout_request& r);

  /// An AbortRollouts from the trainer, split by the worker holding each id, in worker name
  /// order, ids in the order given. Ids that are not in flight (finished, never requested) are
  /// dropped; a worker with none of the ids gets nothing. The workers' abort finish events then
  /// free the slots as a normal finish does.
  dispatch_result abort(const rollout::abort_request& a) const;

  /// A RolloutEvent from worker `e.worker`: a finish frees the request's slot, forgets it and
  /// feeds its token count to the placement's generation estimate.
  /// Start and chunk events change nothing, and so does a finish sent by a worker that no
  /// longer holds the request (a lost worker's finish arriving after its peer_down: the request
  /// runs elsewhere by then). Returns true when it freed a slot.
  bool on_event(const rollout::event_record& e);

  /// Rollout worker `worker` is gone (peer_down, for reason `why`): its unfinished requests
  /// are placed again, in request id order, each with replaced_from = `worker` so its
  /// trajectory says so (counted by the trainer as replaced_requests); a warning names the
  /// worker, `why` and how many. A name that is not live changes nothing.
  dispatch_result worker_lost(const std::string& worker, const std::string& why);

  /// Requests held: submitted and not finished.
  size_t held() const {
    return held_.size();
  }

  /// The checkpointed state, as save_placement_state writes it (placement.hpp).
  std::string save_state() const;

  /// Restores a state written by save_state; returns why it refused one (changing nothing), or
  /// an empty string when it took it.
  std::string restore_state(std::string_view text);

  const scheduler::placement& placement() const {
    return placement_;
  }

private:
  struct held_request {
    rollout::rollout_request request;
    int64_t prompt_tokens = 0;   ///< tokens; 0 without a prompt function
    std::vector<uint64_t> chain; ///< block_chain of the prompt, kept for re-placement
  };

  /// Places held request `h` and appends the send or the failure to `out`.
  void place(const held_request& h, dispatch_result& out);

  scheduler::placement placement_;
  prompt_fn prompt_;
  std::map<uint64_t, held_request> held_; ///< by request id
  std::optional<uint64_t> weight_version_; ///< newest seen in a request
  struct built_prompt {
    std::tuple<uint64_t, ml::task_split, uint64_t> key; ///< group, split, task index
    int64_t tokens = 0;
    std::vector<uint64_t> chain;
  };
  std::optional<built_prompt> last_prompt_; ///< the latest prompt built, for its siblings
};

} // namespace sorl::scheduler
