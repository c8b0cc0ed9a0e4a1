# Sourced by the script tests: `expect NAME WANT_RC WANT_TEXT -- command...` runs the command,
# prints ok or FAIL with its output, and sets fail=1 on a wrong exit code or missing text.
fail=0
expect() {
  local name=$1 want_rc=$2 want_text=$3 out rc
  shift 4
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc != "$want_rc" || "$out" != *"$want_text"* ]]; then
    echo "FAIL: $name: exit $rc (want $want_rc), output:"; echo "$out"; echo "(want: $want_text)"
    fail=1
  else
    echo "ok: $name"
  fi
}
