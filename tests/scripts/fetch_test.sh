#!/usr/bin/env bash
# scripts/fetch-model and scripts/fetch-data refuse bad command lines with exit 2 and a
# message, before any download or virtualenv; --help exits 0. Nothing here touches the network.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/expect.sh"
fm="$root/scripts/fetch-model"
fd="$root/scripts/fetch-data"
expect "fetch-model --help" 0 "Usage: scripts/fetch-model NAME [DEST]" -- "$fm" --help
expect "fetch-model help shows no script code" 0 "" -- bash -c "! '$fm' --help 2>&1 | grep -q 'set -euo'"
expect "fetch-model: an unknown model" 2 "unknown model 'nope' (known: smollm2-135m-instruct)" -- "$fm" nope
expect "fetch-model: no arguments" 2 "Usage:" -- "$fm"
expect "fetch-data --help" 0 "Usage: scripts/fetch-data reasoning-gym TASK" -- "$fd" --help
expect "fetch-data: not a number" 2 "--train needs a whole number, got 'abc'" -- "$fd" reasoning-gym countdown --train abc
expect "fetch-data: a missing value" 2 "--eval needs a value" -- "$fd" reasoning-gym countdown --eval
expect "fetch-data: zero entries" 2 "--train and --eval need at least 1 entry" -- "$fd" reasoning-gym countdown --train 0
expect "fetch-data: an unknown option" 2 "unknown option '--size'" -- "$fd" reasoning-gym countdown --size 3
expect "fetch-data: another source" 2 "Usage:" -- "$fd" huggingface gsm8k
expect "fetch-data: --set without =" 2 "--set needs KEY=VALUE, got 'hard'" -- "$fd" reasoning-gym chain_sum --set hard
exit $fail
