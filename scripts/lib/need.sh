# Sourced by the scripts in bench/ and scripts/: say what is missing and how to install it
# (exit 2, nothing run) instead of failing later with a traceback or a silent cmake error.
# The caller sets `me` (its name in messages) and `root` (the repository root).

# need_commands CMD:DEBIAN_PACKAGE ...   every command on PATH (or an absolute path that runs)
need_commands() {
  local missing=() item cmd pkg
  for item in "$@"; do
    cmd=${item%%:*} pkg=${item#*:}
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    echo "$me: missing ${missing[*]} (Debian packages); install with:" >&2
    echo "  sudo apt-get install ${missing[*]}     (or: scripts/install-deps --with-extras)" >&2
    exit 2
  fi
}

# need_python_modules PYTHON MODULE:DEBIAN_PACKAGE ...   every module importable by PYTHON
need_python_modules() {
  local python=$1 missing=() item
  shift
  need_commands "$python:python3"
  for item in "$@"; do
    "$python" -c "import ${item%%:*}" >/dev/null 2>&1 || missing+=("${item#*:}")
  done
  if ((${#missing[@]})); then
    echo "$me: $python cannot import what it needs; install Debian's ${missing[*]}:" >&2
    echo "  sudo apt-get install ${missing[*]}     (or: scripts/install-deps --with-extras)" >&2
    echo "  (a virtualenv's or conda's torch is not used: the bench runs $python)" >&2
    exit 2
  fi
}

# build_target BUILD_DIR TARGET [cmake configure args...]
# Configures BUILD_DIR when it is not configured yet (Ninja when installed), builds TARGET, and
# shows cmake's or the compiler's output only when a step fails.
build_target() {
  local build=$1 target=$2 log
  shift 2
  need_commands cmake:cmake
  log=$(mktemp)
  if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
    local generator=()
    if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
    if ! cmake -S "$root" -B "$build" "${generator[@]}" "$@" >"$log" 2>&1; then
      cat "$log" >&2
      echo "$me: configuring $build failed (above); scripts/install-deps installs what sorl" \
        "needs" >&2
      rm -f "$log"
      exit 2
    fi
  fi
  if ! cmake --build "$build" --target "$target" >"$log" 2>&1; then
    cat "$log" >&2
    echo "$me: building $target in $build failed (above)" >&2
    rm -f "$log"
    exit 2
  fi
  rm -f "$log"
}
