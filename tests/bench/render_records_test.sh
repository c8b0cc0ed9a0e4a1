#!/usr/bin/env bash
# bench/render-records on a small fixture record (tests/bench/render_fixture/record.json) whose
# rendered tables are written out by hand in expected.md: rewriting, --check on a current and on
# a stale file, a block whose record is missing, and malformed markers.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/tests/scripts/expect.sh"
render=$root/bench/render-records
fix=$here/render_fixture
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$fix/record.json" "$fix/input.md" "$tmp/"

expect "check names the stale blocks" 1 "input.md:5: stale: the block of record.json table=speed" -- \
  "$render" --check --root "$tmp" "$tmp/input.md"
expect "check names every stale block" 1 "input.md:13: stale: the block of record.json table=speed" -- \
  "$render" --check --root "$tmp" "$tmp/input.md"
expect "check changes nothing" 0 "" -- cmp "$fix/input.md" "$tmp/input.md"
expect "rendering notices the missing record" 0 "input.md:16: skipped: not-yet.json does not exist yet" -- \
  "$render" --root "$tmp" "$tmp/input.md"
expect "rendering gives the hand-written tables" 0 "" -- diff "$fix/expected.md" "$tmp/input.md"
expect "check passes once rendered, with the notice" 0 "input.md:25: skipped: not-yet.json" -- \
  "$render" --check --root "$tmp" "$tmp/input.md"
expect "rendering again changes nothing" 0 "" -- "$render" --root "$tmp" "$tmp/input.md"
expect "still the hand-written tables" 0 "" -- diff "$fix/expected.md" "$tmp/input.md"

# rows= picks rows by their first cell, in its order.
printf '<!-- record: record.json table=speed columns=batch,sorl rows=64,1 -->\n<!-- /record -->\n' \
  > "$tmp/rows.md"
{
  echo '<!-- record: record.json table=speed columns=batch,sorl rows=64,1 -->'
  sed -n 6p "$fix/expected.md"
  printf '\n| batch | sorl (tokens/s) |\n|---|---|\n| 64 | 308.3 |\n| 1 | 27.4 |\n'
  echo '<!-- /record -->'
} > "$tmp/rows-expected.md"
expect "rows= renders" 0 "" -- "$render" --root "$tmp" "$tmp/rows.md"
expect "rows= picks and orders rows" 0 "" -- diff "$tmp/rows-expected.md" "$tmp/rows.md"

# A figure changed in the record makes the rendered block stale.
sed 's/27\.44/27.94/' "$fix/record.json" > "$tmp/record.json"
expect "a changed record makes the block stale" 1 "input.md:5: stale" -- \
  "$render" --check --root "$tmp" "$tmp/input.md"

cp "$fix/record.json" "$tmp/record.json"
# refused NAME FILE TEXT WANT: --check on a file holding TEXT exits 2 with WANT.
refused() {
  printf '%b' "$3" > "$tmp/$2"
  expect "$1" 2 "$4" -- "$render" --check --root "$tmp" "$tmp/$2"
}
refused "an unknown table is named with its line" bad-table.md \
  'a\n<!-- record: record.json table=nosuch -->\n<!-- /record -->\n' \
  "bad-table.md:2: the record has no table 'nosuch' (it has: speed)"
refused "an unknown column is named" bad-col.md \
  '<!-- record: record.json table=speed columns=batch,nosuch -->\n<!-- /record -->\n' \
  "bad-col.md:1: table 'speed' has no column nosuch"
refused "an unknown row is named" bad-row.md \
  '<!-- record: record.json table=speed rows=1,2 -->\n<!-- /record -->\n' \
  "bad-row.md:1: table 'speed' has no row 2"
refused "an unclosed block is named" open.md '<!-- record: record.json table=speed -->\ntext\n' \
  "open.md:1: the record block has no closing <!-- /record -->"
refused "an unknown option is named" option.md \
  '<!-- record: record.json tabel=speed -->\n<!-- /record -->\n' \
  "option.md:1: unknown marker option 'tabel'"
refused "a malformed marker is named" malformed.md '<!-- record:record.json -->\n' \
  "malformed.md:1: malformed record marker"
echo '{"format": "sorl-bench-record", "format_version": 99}' > "$tmp/future.json"
refused "a record of another format version is refused" future.md \
  '<!-- record: future.json table=speed -->\n<!-- /record -->\n' \
  "future.md:1: ${tmp}/future.json: record format_version 99"
exit $fail
