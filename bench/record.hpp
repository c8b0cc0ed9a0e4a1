#pragma once

// A benchmark's record: one JSON file per run saying what was measured (named tables whose
// columns carry units, with the baselines measured in the same run), by which binary (version,
// commit, dirty flag), how it was invoked, when, and on what machine (CPU, cores, the load
// average at the start, so that a figure taken on a busy machine says so). bench/record.py
// writes the same format from Python, bench/render-records turns records into the docs'
// tables; docs/benchmarks.md describes the fields.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace sorl::bench {

/// The record format's version (the "format_version" field): raised when a field changes
/// meaning or goes away, so that the renderer can refuse a record it would misread.
inline constexpr int record_format_version = 1;

/// One table cell: empty (a figure the run has not got; rendered "-"), a number or a text.
/// Non-finite numbers are written as empty cells (JSON has no NaN).
struct record_cell {
  std::variant<std::monostate, double, std::string> value;

  record_cell() = default;
  record_cell(double v) : value(v) {
  }
  template <class Int, std::enable_if_t<std::is_integral_v<Int>, int> = 0>
  record_cell(Int v) : value(static_cast<double>(v)) {
  }
  record_cell(std::string s) : value(std::move(s)) {
  }
  record_cell(const char* s) : value(std::string(s)) {
  }
};

/// One column of a result table.
struct record_column {
  /// The stable name a docs marker selects the column by (bench/render-records `columns=`):
  /// letters, digits and `_ . -` only, unique in its table.
  std::string key;
  /// The column's heading in a rendered table, e.g. "sorl" or "memory bound".
  std::string label;
  /// The values' unit, e.g. "tokens/s", "s", "%", "MiB"; "" for counts and names.
  std::string unit;
  /// Decimals the renderer shows; -1 shows the number as written (integers without decimals).
  int digits = -1;
  /// True for a figure measured in the same run as a point of comparison (a peer, the previous
  /// path, a limit of the machine), not for sorl's own figure.
  bool baseline = false;
  /// Significant digits the renderer shows instead of `digits` when > 0 (figures that span
  /// decades, such as a mismatch of 4.1e-6 nats).
  int significant = 0;

  record_column(std::string key_, std::string label_, std::string unit_ = "", int digits_ = -1,
                bool baseline_ = false, int significant_ = 0)
    : key(std::move(key_)), label(std::move(label_)), unit(std::move(unit_)), digits(digits_),
      baseline(baseline_), significant(significant_) {
  }
};

/// A named table of results: the columns, then rows of exactly one cell per column.
struct record_table {
  std::string name;  ///< the name a docs marker selects the table by (`table=`)
  std::string title; ///< one line saying what the rows are
  std::vector<record_column> columns;
  std::vector<std::vector<record_cell>> rows;
  /// Indices of rows that are baselines measured in the same run (e.g. a peer's row).
  std::vector<std::size_t> baseline_rows;

  /// Appends a row; throws std::invalid_argument naming the table when `cells` does not have
  /// one cell per column.
  void add_row(std::vector<record_cell> cells);
};

/// The machine a record was taken on, read from /proc and the scheduler at the record's start.
struct record_machine {
  std::string cpu_model;    ///< /proc/cpuinfo's first "model name", or "unknown"
  int cores_online = 0;     ///< online CPUs (nproc --all)
  int cores_available = 0;  ///< CPUs this process may run on (sched_getaffinity, nproc)
  double load_1min = -1;    ///< /proc/loadavg's 1-minute load average; -1 when unreadable
  double memory_gib = 0;    ///< MemTotal, GiB
  std::string gpu = "none"; ///< the NVIDIA driver's GPU models, comma-separated, or "none"
};

/// Reads the machine's facts now (see record_machine).
record_machine read_record_machine();

/// The GPU models the NVIDIA driver lists under `folder` (one subfolder per GPU, each with an
/// `information` file whose "Model:" line names it), sorted, comma-separated; "none" when there
/// are none or the folder does not exist (no driver).
std::string record_gpu_models(const std::string& folder = "/proc/driver/nvidia/gpus");

/// The numeric libraries the measured code ran on; empty fields are written as null (not
/// linked). bench/record_ml.hpp fills them for the benches that link libtorch.
struct record_runtime {
  std::string libtorch;    ///< libtorch's version, e.g. "1.13.0"
  std::string blas;        ///< the BLAS file mapped into the process (sorl::loaded_blas)
  std::string cpu_kernels; ///< sorl::cpu_kernels_summary(): BLAS, ATen and oneDNN kernels
};

/// The current time as "YYYY-MM-DDTHH:MM:SSZ" (UTC, whole seconds).
std::string utc_now();

/// Quotes `arg` for a POSIX shell when it holds anything beyond letters, digits and
/// `_ - . / , : = + @ %`, so that a record's command line can be pasted back.
std::string shell_quote(const std::string& arg);

/// Where a bench writes its record: `flag` (the bench's --record PATH) when not empty, else
/// $SORL_BENCH_RECORD when set and not empty, else runs/bench/<bench>-<utc>.json under the
/// working directory (runs/ is git-ignored). "none" for either writes no record.
std::string record_path(const std::string& bench, const std::string& flag);

/// One run's record. Constructed at the bench's start (the date, the load average and the
/// machine are read then), filled as results come in, written once at the end.
class bench_record {
public:
  /// `bench`: the bench's name in file names and records, e.g. "decode-model". The command is
  /// $SORL_BENCH_COMMAND when a driver script set it (the command a reader reruns, e.g.
  /// `bench/decode_model.sh MODEL ...`), else `argv` shell-quoted with argv[0] relative to
  /// the working directory; `argv` itself is kept as well. Likewise $SORL_BENCH_START
  /// ("YYYY-MM-DDTHH:MM:SSZ LOAD", bench/record.sh) gives the driver's start date and load
  /// average, and the duration counts from it.
  bench_record(std::string bench, int argc, char** argv);

  /// The threads the bench's measured code ran with (libtorch's intra-op threads, the codec's
  /// workers, ...).
  void set_threads(int threads);

  /// The numeric libraries (bench/record_ml.hpp `ml_record_runtime()` for libtorch benches).
  void set_runtime(record_runtime runtime);

  /// A setting of the run that a reader needs to compare it with another (a prompt length, a
  /// model directory, a seed); replaces an earlier value of `key`.
  void set_parameter(const std::string& key, record_cell value);

  /// Adds an empty table and returns it for its rows; throws std::invalid_argument when a
  /// table of that name exists, a key is repeated or holds other characters than letters,
  /// digits and `_ . -`. The reference stays valid for the record's lifetime.
  record_table& add_table(std::string name, std::string title, std::vector<record_column> columns);

  /// The record as JSON text (format_version record_format_version; docs/benchmarks.md).
  std::string to_json() const;

  /// Writes to_json() to `path` (record_path's result; "none" writes nothing), creating its
  /// folder, and returns whether a file was written; throws std::runtime_error naming the
  /// path when it cannot be written. The record's duration is the time since construction.
  bool write(const std::string& path) const;

  const std::string& bench() const {
    return bench_;
  }
  const std::deque<record_table>& tables() const {
    return tables_;
  }

private:
  std::string bench_;
  std::string command_;
  std::vector<std::string> argv_;
  std::string date_;
  double start_s_ = 0; ///< steady clock at construction, seconds
  record_machine machine_;
  int threads_ = 0;
  record_runtime runtime_;
  std::vector<std::pair<std::string, record_cell>> parameters_;
  std::deque<record_table> tables_;
};

} // namespace sorl::bench
