#include "actors/roles.hpp"

#include "actors/learner/learner_actor.hpp"
#include "actors/rollout/worker_actor.hpp"
#include "actors/sagc/controller_actor.hpp"
#include "actors/scheduler/scheduler_actor.hpp"
#include "actors/smoke/smoke_actors.hpp"
#include "actors/suffix_index/keeper_actor.hpp"
#include "actors/sync/publisher_actor.hpp"
#include "actors/trainer/trainer_actor.hpp"
#include "runtime/role_names.hpp"

namespace sorl {

const role_table& builtin_roles() {
  static const role_table table{
    {role::trainer, "runs the synchronous GRPO / DAPO step loop, logs and checkpoints",
     spawn_trainer},
    {role::learner, "advantages, clipped policy loss, AdamW update; evaluation; checkpoints",
     spawn_learner},
    {role::sync_publisher, "broadcasts each new bf16 weight version to the rollout workers",
     spawn_sync_publisher},
    {role::sagc_controller, "chooses the group size G and measures rollout timing / stragglers",
     spawn_sagc_controller},
    {role::scheduler, "places generation requests on rollout workers, re-places on failure",
     spawn_scheduler},
    {role::rollout_worker, "generates rollouts with continuous batching and scores rewards",
     spawn_rollout_worker},
    {role::suffix_index_keeper,
     "optional: shares finished responses between the rollout workers' suffix trees",
     spawn_suffix_index_keeper},
    {role::ping, "smoke test: sends rounds of Ping envelopes to every pong and ends the job",
     smoke::spawn_ping},
    {role::pong, "smoke test: answers each Ping with a Pong", smoke::spawn_pong},
  };
  return table;
}

} // namespace sorl
