#pragma once

// The one message type actors exchange for protocol payloads (ARCHITECTURE.md §4): serialized
// Cap'n Proto bytes plus the id of the schema's root struct. The bytes live in an immutable,
// reference-counted buffer, so fanning one envelope out to many in-process actors copies a
// pointer, not the payload; across nodes CAF serializes the bytes once per connection.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/fwd.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>
#include <caf/none.hpp>
#include <caf/meta/type_name.hpp>

#include <capnp/generated-header-support.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

namespace sorl {

/// Why an envelope was rejected. Registered with CAF as category "envelope".
enum class envelope_errc : uint8_t {
  ok = 0,
  empty,          ///< no bytes at all
  oversized,      ///< more bytes than the reader's limit allows
  misaligned,     ///< byte count not a multiple of 8 (capnp words)
  wrong_schema,   ///< schema id differs from the one the reader expects
  malformed,      ///< capnp rejected the bytes (truncated segment table, bad pointer, ...)
  limit_exceeded, ///< traversal or nesting limit hit: hostile or runaway message
  truncated,      ///< the wire length claims more bytes than the sender sent
};

const char* to_string(envelope_errc x);

/// Largest envelope payload in bytes (1 GiB), on the wire and when opened: config keys that
/// size messages (sync.bucket_bytes, smoke.payload_bytes) are bounded far below it.
inline constexpr size_t envelope_max_bytes = size_t{1} << 30;

/// Bounds applied when opening an envelope; defaults suit control messages and delta buckets.
struct envelope_limits {
  size_t max_bytes = envelope_max_bytes; ///< bytes
  uint64_t traversal_words = 0;        ///< 0 = 8 × message words (capnp's own heuristic)
  int nesting = 64;                    ///< capnp's default
};

/// Serialized capnp message + schema id. Cheap to copy (shares the buffer); immutable.
class envelope {
public:
  using buffer = kj::Array<capnp::word>;

  envelope() = default;
  envelope(uint64_t schema_id, std::shared_ptr<const buffer> words)
    : schema_id_(schema_id), words_(std::move(words)) {
  }

  /// capnp type id of the root struct (`capnp::typeId<T>()`), 0 for an empty envelope.
  uint64_t schema_id() const noexcept {
    return schema_id_;
  }
  /// Payload size in bytes (always a multiple of 8).
  size_t size_bytes() const noexcept {
    return words_ ? words_->size() * sizeof(capnp::word) : 0;
  }
  /// Start of the shared payload; equal pointers mean the same shared bytes.
  const void* data() const noexcept {
    return words_ ? static_cast<const void*>(words_->begin()) : nullptr;
  }
  /// Number of holders of the payload (for sharing tests and diagnostics).
  long use_count() const noexcept {
    return words_.use_count();
  }
  const std::shared_ptr<const buffer>& words() const noexcept {
    return words_;
  }

  /// Builds an envelope from raw bytes (e.g. received from a socket or crafted by a test);
  /// copies them into an aligned buffer. Rejects non-word-multiple sizes: misaligned.
  static caf::expected<envelope> from_bytes(uint64_t schema_id, const void* bytes, size_t n);

private:
  uint64_t schema_id_ = 0;
  std::shared_ptr<const buffer> words_;
};

/// Serializes a builder's message into a new envelope (one copy into a flat array).
template <class Schema>
envelope make_envelope(capnp::MessageBuilder& builder) {
  auto flat = capnp::messageToFlatArray(builder);
  return envelope{capnp::typeId<Schema>(),
                  std::make_shared<const envelope::buffer>(std::move(flat))};
}

/// Builds an envelope for `Schema`, letting `fill` write the fields of the root struct.
/// Example: `auto e = build_envelope<msg::Ping>([&](msg::Ping::Builder b) { b.setRound(1); });`
template <class Schema, class Fill>
envelope build_envelope(Fill&& fill) {
  capnp::MallocMessageBuilder builder;
  fill(builder.initRoot<Schema>());
  return make_envelope<Schema>(builder);
}

/// An open envelope. Holds a reference to the bytes, so the root reader stays valid while
/// this object lives; keep it inside the message handler. Field access can still throw
/// kj::Exception on a hostile message (capnp checks each pointer lazily, under the traversal
/// limit): prefer with_envelope(), which turns that into an error value.
template <class Schema>
class envelope_reader {
public:
  typename Schema::Reader root() const {
    return root_;
  }

private:
  template <class S>
  friend caf::expected<envelope_reader<S>> open_envelope(const envelope&,
                                                         const envelope_limits&);
  std::shared_ptr<const envelope::buffer> words_;
  std::shared_ptr<capnp::FlatArrayMessageReader> reader_;
  typename Schema::Reader root_;
};

namespace detail {

/// Validates size, alignment and schema id, then parses the segment table under the limits.
caf::error check_envelope(const envelope& e, uint64_t expected_schema,
                          const envelope_limits& limits,
                          std::shared_ptr<capnp::FlatArrayMessageReader>& reader_out);

caf::error make_envelope_error(envelope_errc code, std::string what);

/// Maps a capnp exception to malformed or limit_exceeded.
caf::error from_kj_exception(const kj::Exception& ex);

} // namespace detail

/// Opens `e` as `Schema`. Errors (category "envelope"): empty, oversized, misaligned,
/// wrong_schema, malformed, limit_exceeded; never throws for bad input.
template <class Schema>
caf::expected<envelope_reader<Schema>> open_envelope(const envelope& e,
                                                     const envelope_limits& limits = {}) {
  envelope_reader<Schema> result;
  if (auto err = detail::check_envelope(e, capnp::typeId<Schema>(), limits, result.reader_))
    return err;
  try {
    result.words_ = e.words();
    result.root_ = result.reader_->template getRoot<Schema>();
  } catch (const kj::Exception& ex) {
    return detail::from_kj_exception(ex);
  }
  return result;
}

/// Opens `e` as `Schema` and calls `fn(Schema::Reader)`; any capnp exception raised while
/// `fn` reads fields (bad pointer, traversal or nesting limit) becomes the returned error,
/// so a hostile message never unwinds through an actor. Returns an empty error on success.
template <class Schema, class Fn>
caf::error with_envelope(const envelope& e, Fn&& fn, const envelope_limits& limits = {}) {
  auto opened = open_envelope<Schema>(e, limits);
  if (!opened)
    return std::move(opened.error());
  try {
    fn(opened->root());
  } catch (const kj::Exception& ex) {
    return detail::from_kj_exception(ex);
  }
  return caf::none;
}

/// Human-readable form of an error from open_envelope / from_bytes (or any caf::error).
std::string describe(const caf::error& err);

// -- CAF serialization (cross-node) ---------------------------------------------------------

/// Writes schema id, byte count and the raw bytes once. Errors: oversized (more than
/// envelope_wire_limit bytes, which no receiver would accept).
caf::error inspect(caf::serializer& f, envelope& x);
/// Reads schema id, byte count and bytes. The count is checked before anything is allocated:
/// misaligned, oversized (above envelope_wire_limit), truncated (more than the bytes left in a
/// caf::binary_deserializer, the one CAF's network layer uses). A deserializer that cannot
/// tell how many bytes are left is read in chunks of at most 1 MiB, so memory grows with the
/// bytes that actually arrive, never with the claimed count.
caf::error inspect(caf::deserializer& f, envelope& x);

/// Hard cap on an envelope crossing the wire, bytes: the same as the reader's own limit.
inline constexpr size_t envelope_wire_limit = envelope_max_bytes;

/// For CAF's to_string and logging: prints the schema id and size only.
template <class Inspector>
typename std::enable_if<!std::is_base_of<caf::serializer, Inspector>::value
                          && !std::is_base_of<caf::deserializer, Inspector>::value,
                        typename Inspector::result_type>::type
inspect(Inspector& f, envelope& x) {
  auto id = x.schema_id();
  auto n = static_cast<uint64_t>(x.size_bytes());
  return f(caf::meta::type_name("sorl::envelope"), id, n);
}

} // namespace sorl

CAF_ERROR_CODE_ENUM(sorl::envelope_errc, "envelope")
