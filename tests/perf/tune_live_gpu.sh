#!/usr/bin/env bash
# `vtui tune` under one load on a GPU (vLLM 0.24 from ../shared/gpu): the seed articles' space on the
# Qwen2.5-7B architecture with dummy weights at 1024/256 tokens, from the command to the winner
# checked on its own start (target: at most 10 minutes), then the exhaustive grid (--no-live
# --no-prune: a start and a full limit search per configuration) on a 6-configuration subspace
# that holds the live winner, as the reference winner.
# On the GPU machine, vLLM staged per ../shared/gpu/README.md in /tmp/site:
#   tests/perf/tune_live_gpu.sh setup OUTDIR    (vtui's own wheels from .gpuwheels/ into /tmp/site, and its
#                                                vllm.general_plugins entry point, so the servers it starts load the hook)
#   tests/perf/tune_live_gpu.sh live OUTDIR     (the seed space, --budget-min 10, or $BUDGET_MIN)
#   tests/perf/tune_live_gpu.sh grid OUTDIR     (6 configurations, one start each; run again to --resume)
#     GRID_BATCHED=2048 GRID_SEQS=64,256 narrow it (a fresh machine has no saved search to resume: the rest
#     of a grid cut short on an earlier machine), GRID_TAG names its files (grid-TAG.*)
# Both arms: --enforce-eager (starts of ~40 s instead of ~80 s: the grid's six starts fit one call),
# max-model-len 2048 (so chunked prefill off is valid with budgets 2048 and 8192), SLO p99 TTFT
# <= 500 ms and p99 TPOT <= 40 ms, steps of >= 100 requests and >= 5 s.
set -euo pipefail
what=${1:?setup, live or grid}; out=${2:?OUTDIR}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VTUI_HOME=${VTUI_HOME:-/tmp/vtuihome}
vtui() { python3 -m tui.cli "$@"; }
common=(--model qwen2.5-7b --input-len 1024 --output-len 256 --slo-ttft-p99-ms 500 --slo-tpot-p99-ms 40
        --flag enforce-eager=true --flag max-model-len=2048 --min-requests 100 --min-step-s 5
        --start-timeout 300 --step-timeout 120)
case $what in
setup)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpuwheels/*.whl
    python3 -c "import sys; sys.path[:0] = ['tests/perf', '.']; from pathlib import Path; from live_gpu import write_dist_info; print(write_dist_info(Path('/tmp/site')))"
    ;;
live)
    start=$(date +%s)
    vtui tune "${common[@]}" --budget-min "${BUDGET_MIN:-10}" --json "$out/live.json" \
        2> >(tee "$out/live.err.txt" >&2) | tee "$out/live.out.txt"
    echo "command to winner: $(( $(date +%s) - start )) s" | tee -a "$out/live.out.txt"
    ;;
grid)
    # The winner's neighbourhood: chunked prefill on, budgets 2048/8192, max-num-seqs 64/128/256.
    # Its own home: the one search there is the grid, resumed where an earlier call left it.
    export VTUI_HOME=$VTUI_HOME-grid
    saved=$(vtui tune --list 2>/dev/null | awk '$2 != "done" && NF > 3 {print $1; exit}')
    if [ -n "$saved" ]; then resume=(--resume "$saved"); else resume=(); fi
    f=$out/grid${GRID_TAG:+-$GRID_TAG}
    start=$(date +%s)
    vtui tune "${common[@]}" --no-live --no-prune --space enable-chunked-prefill=on \
        --space "max-num-batched-tokens=${GRID_BATCHED:-2048,8192}" --space "max-num-seqs=${GRID_SEQS:-64,128,256}" \
        --budget-min 9 "${resume[@]}" --json "$f.json" 2> >(tee "$f.err.txt" >&2) | tee "$f.out.txt"
    echo "grid call: $(( $(date +%s) - start )) s" | tee -a "$f.out.txt"
    ;;
*) echo "error: setup, live or grid, not $what" >&2; exit 2 ;;
esac
