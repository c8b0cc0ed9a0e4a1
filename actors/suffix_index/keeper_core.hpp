#pragma once

// The suffix-index keeper's logic, free of CAF (ARCHITECTURE.md §6 WAR): each rollout worker
// drafts from suffix trees it keeps itself (suffix_drafter.hpp), and the keeper keeps every
// worker's global tree current with the finished responses the other workers generated. A
// worker sends its finished turns (SuffixResponses, messages/suffix.capnp); the keeper checks
// the message and names the workers to forward it to. Drafts never pass through the keeper:
// a draft costs well under a microsecond in the worker, less than any message.
//
// A message from a peer may be malformed or hostile: it is refused with a reason for the
// log, never thrown on. The keeper does not know the model's vocabulary; each worker checks
// token ids against its own (worker_core::add_peer_responses).

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace sorl::suffix_index {

/// Responses as token ids, one vector per finished turn.
using token_responses = std::vector<std::vector<std::int32_t>>;

/// Most responses in one SuffixResponses message.
inline constexpr std::size_t max_message_responses = 256;
/// Longest response in one message, tokens.
inline constexpr std::size_t max_response_tokens = 65536;
/// A worker's bound on one message's tokens, bytes at 4 bytes a token (1 MiB).
inline constexpr std::size_t max_message_token_bytes = std::size_t{1} << 20;

/// What keeper_core::on_responses decided.
struct keeper_forward {
  /// The workers to send the responses to: every known worker but the origin, in name
  /// order. Empty when refused, or when the origin is the only worker.
  std::vector<std::string> destinations;
  std::string refusal; ///< why the message is dropped; empty when accepted
};

/// Counts since construction.
struct keeper_counters {
  std::int64_t received = 0;            ///< messages handed to on_responses
  std::int64_t refused = 0;             ///< of them, dropped
  std::int64_t responses_in = 0;        ///< responses of the accepted messages
  std::int64_t tokens_in = 0;           ///< their tokens
  std::int64_t sends = 0;               ///< messages forwarded, one per destination
  std::int64_t responses_forwarded = 0; ///< responses forwarded, summed over destinations
  std::int64_t tokens_forwarded = 0;    ///< their tokens, summed over destinations
};

/// Called from one thread.
class keeper_core {
public:
  /// A rollout worker of the roster, by name ("rollout_worker#0@node"). Joining twice is a
  /// no-op.
  void join(const std::string& worker);
  /// The worker is gone: nothing is forwarded to it, and its messages are refused. Returns
  /// whether it was known.
  bool leave(const std::string& worker);
  std::size_t workers() const noexcept {
    return workers_.size();
  }

  /// The finished responses worker `origin` generated. Refused: an origin that is not a
  /// known worker, an empty list, more than max_message_responses responses, a response
  /// longer than max_response_tokens tokens, a negative token id.
  keeper_forward on_responses(const std::string& origin, const token_responses& responses);

  const keeper_counters& counters() const noexcept {
    return counters_;
  }
  /// One line for the log at the job's end: what was forwarded and refused.
  std::string summary() const;

private:
  std::set<std::string> workers_;
  keeper_counters counters_;
};

/// A worker's finished turns as messages within the bounds, in order: at most
/// max_message_responses responses and max_message_token_bytes of tokens each. Empty
/// responses and those longer than max_response_tokens are left out (the keeper would drop
/// the whole message for one of the latter) and counted into `*left_out` when given.
std::vector<token_responses> split_for_keeper(token_responses responses,
                                              std::size_t* left_out = nullptr);

} // namespace sorl::suffix_index
