#!/usr/bin/env bash
# Issue 20's H200 proof: energy per token and decode MBU for two configurations of the first
# seed article's table (`vtui sweep`), then a `vtui tune` by goodput per watt.
# On the GPU machine, vLLM staged per ../shared/gpu/README.md in /tmp/site, vtui's own wheels
# (textual, textual-plotext, ...) installed there too:
#   tests/perf/h200_energy.sh sweep OUTDIR     (two server starts, about 5 minutes)
#   tests/perf/h200_energy.sh tune OUTDIR      (about 8 minutes)
set -euo pipefail
what=${1:?sweep or tune}; out=${2:?OUTDIR}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VTUI_HOME=${VTUI_HOME:-/tmp/vtuihome}
vtui() { python3 -m tui.cli "$@"; }
case $what in
sweep)
    vtui sweep chunked-enable-256 chunked-enable-2048 --model qwen2.5-7b --requests 512 --concurrency 128 \
        --warmup 8 --format markdown --output "$out/sweep.md" 2> >(tee "$out/sweep.err.txt" >&2) | tee "$out/sweep.out.txt"
    vtui history list --limit 4 --format json > "$out/history.json" 2>&1 || true
    ;;
tune)
    vtui tune --model qwen2.5-7b --objective goodput-per-watt --input-len 1024 --output-len 128 \
        --slo-ttft-p99-ms 500 --slo-tpot-p99-ms 30 \
        --space max-num-batched-tokens=2048,8192 --flag max-num-seqs=128 --flag enforce-eager=true \
        --budget-min 7.5 --min-requests 100 --min-step-s 5 --start-timeout 240 --step-timeout 120 \
        2> >(tee "$out/tune.err.txt" >&2) | tee "$out/tune.out.txt"
    vtui tune --list > "$out/tune-list.txt" 2>&1 || true
    ;;
*) echo "error: sweep or tune, not $what" >&2; exit 2 ;;
esac
