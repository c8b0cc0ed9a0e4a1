#pragma once

// Translation between the suffix-index protocol (messages/suffix.capnp: SuffixResponses) and
// its plain struct, for the shells that send and read it: the rollout worker's and the
// suffix-index keeper's. Reading copies what the message holds; the keeper's core judges it
// (keeper_core.hpp) and the worker's core checks token ids against its vocabulary.

#include <string>

#include "actors/suffix_index/keeper_core.hpp"
#include "messages/suffix.capnp.h"
#include "runtime/envelope.hpp"

namespace sorl::suffix_index {

/// A SuffixResponses message: the finished turns worker `origin` generated.
struct suffix_responses {
  std::string origin;
  token_responses responses;
};

/// msg::SuffixResponses of `m`. Throws std::length_error for more than 2^29 - 1 responses or
/// tokens in one response (Cap'n Proto's list bound); callers send far fewer
/// (split_for_keeper).
envelope to_msg(const suffix_responses& m);

/// A SuffixResponses' fields, unchecked. A malformed message raises kj::Exception, which
/// with_envelope / handle_as turn into an error.
suffix_responses from_msg(msg::SuffixResponses::Reader r);

} // namespace sorl::suffix_index
