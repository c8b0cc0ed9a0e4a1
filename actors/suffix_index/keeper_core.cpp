#include "actors/suffix_index/keeper_core.hpp"

#include <fmt/format.h>

#include <utility>

namespace sorl::suffix_index {

namespace {

// A name from a peer's message goes into log lines: bounded and printable, so a hostile one
// can neither flood the log nor forge lines in it.
std::string clipped(const std::string& s) {
  constexpr std::size_t most = 64;
  std::string out = s.substr(0, most);
  for (char& ch : out)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
      ch = '?';
  if (s.size() > most)
    out += fmt::format("... ({} bytes)", s.size());
  return out;
}

} // namespace

void keeper_core::join(const std::string& worker) {
  workers_.insert(worker);
}

bool keeper_core::leave(const std::string& worker) {
  return workers_.erase(worker) != 0;
}

keeper_forward keeper_core::on_responses(const std::string& origin,
                                         const token_responses& responses) {
  ++counters_.received;
  keeper_forward out;
  const auto refuse = [&](std::string why) {
    ++counters_.refused;
    out.refusal = fmt::format("responses from '{}' refused: {}", clipped(origin), why);
    return out;
  };
  if (workers_.count(origin) == 0)
    return refuse("not a rollout worker of this job");
  if (responses.empty())
    return refuse("no responses");
  if (responses.size() > max_message_responses)
    return refuse(
      fmt::format("{} responses, more than {}", responses.size(), max_message_responses));
  std::int64_t tokens = 0;
  for (std::size_t i = 0; i < responses.size(); ++i) {
    const auto& r = responses[i];
    if (r.size() > max_response_tokens)
      return refuse(
        fmt::format("response {} has {} tokens, more than {}", i, r.size(), max_response_tokens));
    for (const std::int32_t t : r)
      if (t < 0)
        return refuse(fmt::format("response {} has the negative token id {}", i, t));
    tokens += static_cast<std::int64_t>(r.size());
  }
  counters_.responses_in += static_cast<std::int64_t>(responses.size());
  counters_.tokens_in += tokens;
  for (const auto& w : workers_)
    if (w != origin)
      out.destinations.push_back(w);
  const auto n = static_cast<std::int64_t>(out.destinations.size());
  counters_.sends += n;
  counters_.responses_forwarded += n * static_cast<std::int64_t>(responses.size());
  counters_.tokens_forwarded += n * tokens;
  return out;
}

std::string keeper_core::summary() const {
  const keeper_counters& c = counters_;
  return fmt::format("{} responses ({} tokens) received in {} messages, forwarded as {} messages "
                     "({} responses, {} tokens); "
                     "{} messages refused",
                     c.responses_in, c.tokens_in, c.received - c.refused, c.sends,
                     c.responses_forwarded, c.tokens_forwarded, c.refused);
}

std::vector<token_responses> split_for_keeper(token_responses responses, std::size_t* left_out) {
  constexpr std::size_t token_bytes = sizeof(std::int32_t);
  std::vector<token_responses> out;
  std::size_t bytes = 0;
  for (auto& r : responses) {
    if (r.empty() || r.size() > max_response_tokens) {
      if (left_out != nullptr)
        ++*left_out;
      continue;
    }
    const std::size_t b = r.size() * token_bytes;
    if (out.empty() || out.back().size() == max_message_responses ||
        bytes + b > max_message_token_bytes) {
      out.emplace_back();
      bytes = 0;
    }
    out.back().push_back(std::move(r));
    bytes += b;
  }
  return out;
}

} // namespace sorl::suffix_index
