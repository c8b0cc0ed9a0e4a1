#pragma once

// Training checkpoints: model weights in safetensors (readable by other tools), optimizer
// tensors in a second safetensors file, and a JSON sidecar with the step, RNG states and
// a checksum of each file.
//
// Layout under a checkpoint root:
//
//   <root>/step-0000000123/model.safetensors      weights; metadata {"format": "pt", ...}
//                         /optimizer.safetensors  optimizer tensors (may hold none)
//                         /state.json             the sidecar, below
//   <root>/latest                                 "step-0000000123\n"
//
// state.json (format_version 1):
//   {"format": "sorl.checkpoint", "format_version": 1, "step": 123,
//    "rng_states": {"<name>": "<opaque text>", ...}, "metadata": {"<key>": "<text>", ...},
//    "files": {"model.safetensors": {"bytes": 1234, "xxh3_64": "<16 hex digits>"},
//              "optimizer.safetensors": {...}}}
//
// Crash safety: a checkpoint is written completely into a temporary directory under the
// root (`.tmp-step-0000000123-<pid>`, every file fsync'd), renamed to its step directory,
// and only then does `latest` move to it (temporary file + rename). A crash at any point
// leaves `latest` naming the previous complete checkpoint. Loading verifies the sidecar,
// each file's size and checksum, and every tensor before anything is copied into the
// caller's tensors.
//
// A crash while writing leaves its model-sized temporary directory behind. The next save
// under the root removes such stale ones (remove_stale_checkpoint_temporaries), and so does a
// resume from the root (actors/learner/learner_service.cpp). A `.tmp-step-*` directory is
// stale unless a save in this process is writing it, or its name ends in the pid of another
// live process on this host (which may be saving into the same root right now).

#include "runtime/ml/formats/safetensors.hpp"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

namespace sorl::ml {

/// Everything in a checkpoint besides tensors.
struct checkpoint_state {
  std::int64_t step = 0; ///< optimizer steps taken; >= 0
  /// Generator states as opaque text, by name: e.g. `std::mt19937_64` written with
  /// operator<<, or a torch generator's get_state() bytes as hex. (A torch generator's
  /// state tensor can instead travel with the optimizer tensors.)
  string_map rng_states;
  string_map metadata; ///< free-form: config digest, model preset, ...
};

/// What `load_checkpoint` returns besides the weights it copied.
struct loaded_checkpoint {
  std::filesystem::path dir;
  checkpoint_state state;
  named_tensors optimizer; ///< new CPU tensors; the optimizer maps them onto its state
};

/// The sidecar's current format version; loading rejects any other.
constexpr int checkpoint_format_version = 1;

/// The step directory name, "step-" and the step in ten digits ("step-0000000123").
std::string checkpoint_dir_name(std::int64_t step);

/// Saves a checkpoint under `root` (created if needed) and points `<root>/latest` at it;
/// returns its directory. Saving a step that already exists replaces it (the old one is
/// kept until `latest` has moved). Tensors as for save_safetensors; the model file gets
/// metadata {"format": "pt", "sorl.step": "<step>"} so Hugging Face loaders accept it.
/// First removes the stale temporary directories of crashed saves under `root`
/// (remove_stale_checkpoint_temporaries) and, when `removed_stale` is given, appends their
/// paths to it for the caller's log.
/// Throws std::invalid_argument for a negative step or a bad tensor list, and
/// checkpoint_error for I/O failures (then `latest` is unchanged).
std::filesystem::path save_checkpoint(const std::filesystem::path& root, const named_tensors& model,
                                      const named_tensors& optimizer, const checkpoint_state& state,
                                      std::vector<std::filesystem::path>* removed_stale = nullptr);

/// Removes the `.tmp-step-*` directories under `root` that crashed saves left behind: every
/// one but those a save in this process is writing and those whose name ends in the pid of
/// another live process on this host (see the file comment). Returns the paths removed, in
/// name order; one that cannot be removed is left out and left in place (the next call tries
/// again). A missing or unreadable root removes nothing. Never throws but std::bad_alloc.
std::vector<std::filesystem::path> remove_stale_checkpoint_temporaries(const std::filesystem::path& root);

/// The checkpoint `<root>/latest` names, or nullopt when there is no `latest` file.
/// Throws checkpoint_error if `latest` is unreadable, malformed, or names a missing
/// directory.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root);

/// Loads the checkpoint in `dir` (a step directory): checks state.json, the size and
/// XXH3 checksum of both files, and that model.safetensors holds exactly the tensors of
/// `model` with their dtypes and shapes; reads the optimizer tensors; and only then copies
/// the weights into `model`. Throws checkpoint_error (model untouched) on any mismatch or
/// corruption.
loaded_checkpoint load_checkpoint(const std::filesystem::path& dir, const named_tensors& model);

} // namespace sorl::ml
