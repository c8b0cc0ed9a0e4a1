# Sourced by the driver scripts in bench/: the command line their runs' records name
# (bench/record.hpp), so that a record says what a reader reruns (bench/sagc/sagc_sim.sh ...)
# rather than the executable the script started.

# record_command ME ARGS...   exports SORL_BENCH_COMMAND="ME ARGS..." (each argument quoted
# for the shell where it needs it) and SORL_BENCH_START="UTC-DATE LOAD" (now, and the 1-minute
# load average now: the driver's start, which its records report), unless an outer driver has
# set them already.
record_command() {
  if [[ -n ${SORL_BENCH_COMMAND:-} ]]; then
    return
  fi
  local arg load
  SORL_BENCH_COMMAND=$1
  shift
  for arg in "$@"; do
    SORL_BENCH_COMMAND+=" $(printf '%q' "$arg")"
  done
  read -r load _ < /proc/loadavg
  SORL_BENCH_START="$(date -u +%Y-%m-%dT%H:%M:%SZ) $load"
  export SORL_BENCH_COMMAND SORL_BENCH_START
}
