#include "runtime/envelope.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include <caf/binary_deserializer.hpp>
#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/message.hpp>
#include <caf/serializer.hpp>
#include <fmt/format.h>

namespace sorl {

const char* to_string(envelope_errc x) {
  switch (x) {
    case envelope_errc::ok:
      return "ok";
    case envelope_errc::empty:
      return "empty";
    case envelope_errc::oversized:
      return "oversized";
    case envelope_errc::misaligned:
      return "misaligned";
    case envelope_errc::wrong_schema:
      return "wrong_schema";
    case envelope_errc::malformed:
      return "malformed";
    case envelope_errc::limit_exceeded:
      return "limit_exceeded";
    case envelope_errc::truncated:
      return "truncated";
  }
  return "unknown";
}

caf::expected<envelope> envelope::from_bytes(uint64_t schema_id, const void* bytes, size_t n) {
  if (n % sizeof(capnp::word) != 0)
    return detail::make_envelope_error(
      envelope_errc::misaligned, fmt::format("{} bytes is not a whole number of words", n));
  auto words = kj::heapArray<capnp::word>(n / sizeof(capnp::word));
  if (n > 0)
    std::memcpy(words.begin(), bytes, n);
  return envelope{schema_id, std::make_shared<const buffer>(std::move(words))};
}

namespace detail {

caf::error make_envelope_error(envelope_errc code, std::string what) {
  return caf::make_error(code, std::move(what));
}

caf::error from_kj_exception(const kj::Exception& ex) {
  std::string what = ex.getDescription().cStr();
  bool limit = what.find("traversal limit") != std::string::npos
               || what.find("nesting limit") != std::string::npos;
  return make_envelope_error(limit ? envelope_errc::limit_exceeded : envelope_errc::malformed,
                             std::move(what));
}

caf::error check_envelope(const envelope& e, uint64_t expected_schema,
                          const envelope_limits& limits,
                          std::shared_ptr<capnp::FlatArrayMessageReader>& reader_out) {
  auto n = e.size_bytes();
  if (n == 0)
    return make_envelope_error(envelope_errc::empty, "the envelope carries no bytes");
  if (n > limits.max_bytes)
    return make_envelope_error(envelope_errc::oversized,
                               fmt::format("{} bytes exceeds the limit of {} bytes", n,
                                           limits.max_bytes));
  if (e.schema_id() != expected_schema)
    return make_envelope_error(envelope_errc::wrong_schema,
                               fmt::format("schema id {:#018x}, expected {:#018x}",
                                           e.schema_id(), expected_schema));
  capnp::ReaderOptions opts;
  auto words = n / sizeof(capnp::word);
  opts.traversalLimitInWords = limits.traversal_words ? limits.traversal_words : 8 * words;
  opts.nestingLimit = limits.nesting;
  try {
    kj::ArrayPtr<const capnp::word> view{e.words()->begin(), e.words()->size()};
    reader_out = std::make_shared<capnp::FlatArrayMessageReader>(view, opts);
    // The segment table may claim fewer words than were sent: trailing garbage means the
    // sender and we disagree about framing, so it is rejected rather than ignored.
    if (reader_out->getEnd() != view.end())
      return make_envelope_error(envelope_errc::malformed,
                                 "bytes after the end of the last segment");
  } catch (const kj::Exception& ex) {
    reader_out.reset();
    return from_kj_exception(ex);
  }
  return caf::none;
}

} // namespace detail

std::string describe(const caf::error& err) {
  if (!err)
    return "no error";
  if (err.category() == caf::atom("envelope")) {
    std::string out = fmt::format("envelope {}",
                                  to_string(static_cast<envelope_errc>(err.code())));
    const auto& ctx = err.context();
    if (ctx.match_elements<std::string>())
      out += ": " + ctx.get_as<std::string>(0);
    return out;
  }
  return caf::to_string(err);
}

caf::error inspect(caf::serializer& f, envelope& x) {
  uint64_t id = x.schema_id();
  uint64_t n = x.size_bytes();
  if (n > envelope_wire_limit)
    return detail::make_envelope_error(
      envelope_errc::oversized,
      fmt::format("cannot send {} bytes: the wire limit is {} bytes", n, envelope_wire_limit));
  if (auto err = f(id, n))
    return err;
  if (n > 0)
    return f.apply_raw(n, const_cast<void*>(x.data()));
  return caf::none;
}

namespace {

/// Bytes read at a time when the deserializer cannot tell how many are left.
constexpr size_t unknown_length_chunk = size_t{1} << 20;

/// Reads `n` bytes (a multiple of 8, at most envelope_wire_limit) from a deserializer that
/// cannot say how many bytes it holds: chunk by chunk, so a claimed length with nothing behind
/// it fails after one chunk instead of after allocating all of it.
caf::error read_in_chunks(caf::deserializer& f, uint64_t n, envelope::buffer& out) {
  std::vector<char> bytes;
  for (uint64_t done = 0; done < n;) {
    const size_t step = static_cast<size_t>(std::min<uint64_t>(n - done, unknown_length_chunk));
    bytes.resize(static_cast<size_t>(done) + step);
    if (auto err = f.apply_raw(step, bytes.data() + done))
      return err;
    done += step;
  }
  out = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  if (!bytes.empty())
    std::memcpy(out.begin(), bytes.data(), bytes.size());
  return caf::none;
}

} // namespace

caf::error inspect(caf::deserializer& f, envelope& x) {
  uint64_t id = 0;
  uint64_t n = 0;
  if (auto err = f(id, n))
    return err;
  if (n % sizeof(capnp::word) != 0)
    return detail::make_envelope_error(envelope_errc::misaligned,
                                       fmt::format("received length {} bytes", n));
  if (n > envelope_wire_limit)
    return detail::make_envelope_error(
      envelope_errc::oversized,
      fmt::format("received length {} bytes exceeds the limit of {} bytes", n,
                  envelope_wire_limit));
  envelope::buffer words;
  if (auto* bin = dynamic_cast<caf::binary_deserializer*>(&f)) {
    if (n > bin->remaining())
      return detail::make_envelope_error(
        envelope_errc::truncated,
        fmt::format("received length {} bytes, but only {} bytes follow", n, bin->remaining()));
    words = kj::heapArray<capnp::word>(n / sizeof(capnp::word));
    if (n > 0)
      if (auto err = f.apply_raw(n, words.begin()))
        return err;
  } else if (auto err = read_in_chunks(f, n, words)) {
    return err;
  }
  x = envelope{id, std::make_shared<const envelope::buffer>(std::move(words))};
  return caf::none;
}

} // namespace sorl
