# Sourced by the driver scripts in bench/: the command line their runs' records name
# (bench/record.hpp), so that a record says what a reader reruns (bench/sagc/sagc_sim.sh ...)
# rather than the executable the script started.

# record_command ME ARGS...   exports SORL_BENCH_COMMAND="ME ARGS..." (each argument quoted
# for the shell where it needs it), unless an outer driver has set it already.
record_command() {
  if [[ -n ${SORL_BENCH_COMMAND:-} ]]; then
    return
  fi
  local arg
  SORL_BENCH_COMMAND=$1
  shift
  for arg in "$@"; do
    SORL_BENCH_COMMAND+=" $(printf '%q' "$arg")"
  done
  export SORL_BENCH_COMMAND
}
