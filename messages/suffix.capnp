@0x85a662e38d29de80;
# Suffix-index sharing (ARCHITECTURE.md §6 WAR): rollout_worker → suffix_index_keeper → every
# other rollout_worker. Each worker drafts from its own suffix trees; this message brings the
# finished responses of the other workers into its global tree of responses, so that every
# worker drafts from the whole job's text. Optional: without a keeper nothing is sent. Ids
# are stable; evolve by adding fields only.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("sorl::msg");

# Finished policy turns of worker `origin`: sent by that worker to the keeper after a decode
# tick that finished some (speculation on or auto), and forwarded unchanged in content by the
# keeper to every other worker. Bounds (actors/suffix_index/keeper_core.hpp): at most 256
# responses per message, at most 65536 tokens per response; a worker also keeps a message's
# tokens under 1 MiB and splits larger batches. The keeper drops a message that breaks a
# bound, names no worker it knows, or holds a negative token id; a worker skips a response
# with a token id outside the model's vocabulary.
struct SuffixResponses {
  origin @0 :Text;                 # the generating worker, "rollout_worker#<index>@<node>"
  responses @1 :List(List(Int32)); # each turn's sampled token ids, in order (the eos kept)
}
