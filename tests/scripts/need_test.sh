#!/usr/bin/env bash
# scripts/lib/need.sh, which bench/ and scripts/ source: a missing command, python module or
# build step is named with its Debian package and install command, exit 2, nothing run after.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/expect.sh"
run() { bash -c "me=t; root='$root'; source '$root/scripts/lib/need.sh'; $1; echo reached"; }

expect "a missing command names its package" 2 \
  "t: missing sorl-no-such-pkg (Debian packages); install with:
  sudo apt-get install sorl-no-such-pkg" -- run "need_commands sh:dash sorl_no_such_cmd:sorl-no-such-pkg"
expect "present commands pass" 0 "reached" -- run "need_commands sh:dash"
expect "a missing python module names its package" 2 \
  "t: /usr/bin/python3 cannot import what it needs; install Debian's python3-sorl-nope:" \
  -- run "need_python_modules /usr/bin/python3 json:python3 sorl_no_such_module:python3-sorl-nope"
expect "a missing interpreter is a missing command" 2 "t: missing python3 (Debian packages)" \
  -- run "need_python_modules /nonexistent/python3 json:python3"
expect "importable modules pass" 0 "reached" -- run "need_python_modules /usr/bin/python3 json:python3"
# A source tree whose configure step fails the way a missing -dev package does.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src"
echo 'message(FATAL_ERROR "sorl-test: libfoo-dev is missing")' > "$tmp/src/CMakeLists.txt"
failed_configure() {
  bash -c "me=t; root='$tmp/src'; source '$root/scripts/lib/need.sh'; build_target '$tmp/b' x"
}
expect "a failed configure shows cmake's message and stops" 2 "sorl-test: libfoo-dev is missing" \
  -- failed_configure
expect "... and names the step" 2 "t: configuring $tmp/b failed (above)" -- failed_configure
exit $fail
