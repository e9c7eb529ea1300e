#!/usr/bin/env bash
# The whole suite, as `make test` (the README's command, and CI's) runs it on a 2-core box:
#   1. the tests that need neither a real vLLM nor a quiet box, in two processes side by side
#      (VTUI_TEST_SHARD=1/2 and 2/2: whole files, balanced by tests/durations.json, which
#      scripts/durations.py writes from a run with --durations=0);
#   2. then, alone, those marked serial: every test under tests/real (a real vLLM server) and
#      those that time the box.
# Arguments go to every pytest call (e.g. -x, --durations=20). `python -m pytest` alone still runs
# everything in one process.
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
start=$(date +%s)
pids=()
for k in 1 2; do
    VTUI_TEST_SHARD=$k/2 "$py" -m pytest -q -p no:cacheprovider -m "not serial" "$@" >"$logs/part$k.txt" 2>&1 &
    pids+=($!)
done
# pytest's 5 is "no test selected" (a part with nothing of the arguments' tests): not a failure.
ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }
rc=0
for k in 1 2; do
    wait "${pids[$((k - 1))]}"; ok $? || rc=1
    echo "== tests side by side, part $k of 2"
    cat "$logs/part$k.txt"
done
echo "== side by side: $(($(date +%s) - start)) s; now the tests marked serial, alone"
"$py" -m pytest -q -p no:cacheprovider -m serial "$@"; ok $? || rc=1
echo "== the whole suite: $(($(date +%s) - start)) s, $([ $rc = 0 ] && echo passed || echo FAILED)"
exit $rc
