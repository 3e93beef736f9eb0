#!/usr/bin/env bash
# One sitting of bench/supernet.py's ranking protocol (ListOps 512, 2,000-example splits) on a CUDA GPU: many
# bench processes side by side on the one GPU, each writing its own copy of the ledger, until a deadline; then
# the new lines of every copy are gathered. What it runs, in order of priority:
#   - two supernets (default and per_layer spaces, uniform sampling) of SUPERNET_STEPS subnet passes, scored;
#   - the ground-truth rows the ledger lacks: training seed 0 first, then seeds 1 and 2 (the repeats that
#     measure, and average away, the ground truth's own noise), SLOTS processes at a time.
# Every figure it writes is an ordinary ledger or scores line of bench/supernet.py (the GPU named in its
# "machine"); rank them with bench/supernet.py --ledger/--scores on any machine.
#
#   bash bench/supernet_gpu.sh OUTDIR [DEADLINE_SECONDS]
#
# OUTDIR receives ledger-new.jsonl, scores-new.jsonl and log.txt. Environment: SLOTS (8; 0: no ground-truth
# units, the supernets alone: beside 8 of them a supernet pass took 0.37 s on an H200, which the GPU, busy
# at 100%, shared among 10 processes), SUPERNET_STEPS (9000), SUPERNET_SECONDS (unset; set, each supernet
# trains that many seconds instead, and its scores line keeps the passes it reached as its budget: the way to
# fit a sitting shorter than SUPERNET_STEPS would take; leave the deadline a margin for the 24 subnets' scoring),
# SUPERNET_FLAGS (more bench flags for the supernets, e.g. "--warm-start 1000"), PYTHON (python3), LEDGER
# (bench/results/supernet-ranking-listops512.jsonl), PROTOCOL (the bench's budget and device options; a smoke run
# on the CPU names smaller ones). A sitting of the device tool (10 minutes a command):
#
#   SLOTS=0 SUPERNET_SECONDS=360 SUPERNET_FLAGS="--warm-start 1000" bash bench/supernet_gpu.sh OUT 540
set -u
OUTDIR=${1:?usage: bench/supernet_gpu.sh OUTDIR [DEADLINE_SECONDS]}
DEADLINE=${2:-480}
SLOTS=${SLOTS:-8}
SUPERNET_STEPS=${SUPERNET_STEPS:-9000}
SUPERNET_SECONDS=${SUPERNET_SECONDS:-}
SUPERNET_FLAGS=${SUPERNET_FLAGS:-}
PYTHON=${PYTHON:-python3}
LEDGER=${LEDGER:-bench/results/supernet-ranking-listops512.jsonl}
PROTOCOL=${PROTOCOL:-"--max-len 512 --n-train 32000 --n-eval 2000 --device cuda --train-threads 1"}
mkdir -p "$OUTDIR"
work=$(mktemp -d)
log="$OUTDIR/log.txt"
start=$(date +%s)
budget=(--supernet-steps "$SUPERNET_STEPS")
[ -n "$SUPERNET_SECONDS" ] && budget=(--supernet-seconds "$SUPERNET_SECONDS")
echo "start $(date -u +%FT%TZ); deadline ${DEADLINE}s; slots $SLOTS; supernets ${budget[*]} $SUPERNET_FLAGS" >>"$log"
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader -l 30 >"$work/smi.log" 2>&1 &
smi=$!

unit() {  # NAME ARGS...: one bench process with its own copy of the ledger, its output in the work folder
    local name=$1
    shift
    cp "$LEDGER" "$work/ledger-$name.jsonl"
    $PYTHON bench/supernet.py $PROTOCOL --ledger "$work/ledger-$name.jsonl" "$@" >"$work/out-$name.txt" 2>&1
    echo "unit $name rc=$? at $(($(date +%s) - start))s" >>"$work/units.log"
}
export -f unit
export work start LEDGER PYTHON PROTOCOL

supernets=()
for space in default per_layer; do
    # shellcheck disable=SC2086  # (SUPERNET_FLAGS: words)
    unit "sn-$space" --max-new 0 --spaces "$space" --sampling uniform "${budget[@]}" $SUPERNET_FLAGS \
        --scores "$work/scores-$space.jsonl" --supernet-work "$work/sn" --checkpoint-every 1000 &
    supernets+=($!)
done

# Ground-truth units, in order: (space, training seed, subnets); a subnet the ledger holds at that seed is skipped.
{
    for i in 12 13 14; do echo "default 0 $i"; done
    for i in 5 15 18 23; do echo "per_layer 0 $i"; done
    for seed in 1 2; do
        echo "default $seed 1,6,24"; echo "default $seed 21,23,9"; echo "default $seed 4,3,22"
        echo "default $seed 18,19,8"; echo "default $seed 20,17,10"; echo "default $seed 16,11,15"
        echo "default $seed 12"; echo "default $seed 13"; echo "default $seed 14"
        echo "per_layer $seed 16,1,3"; echo "per_layer $seed 4,8,21"; echo "per_layer $seed 17,19,2"
        echo "per_layer $seed 24,20,14"; echo "per_layer $seed 22,9,7"; echo "per_layer $seed 10,6,11,12,13"
        echo "per_layer $seed 5"; echo "per_layer $seed 15"; echo "per_layer $seed 18"; echo "per_layer $seed 23"
    done
} | awk '{print NR, $0}' >"$work/units.txt"
if [ "$SLOTS" -gt 0 ]; then  # (SLOTS=0: the supernets alone)
    timeout -s KILL "$DEADLINE" xargs -P "$SLOTS" -L 1 bash -c \
        'unit "gt-$0-$1-s$2" --truth-only --spaces "$1" --train-seed "$2" --only "$3"' <"$work/units.txt"
fi
# the supernets get what is left of the deadline
running() { for pid in "${supernets[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }
while [ $(($(date +%s) - start)) -lt "$DEADLINE" ] && running; do sleep 2; done
pkill -KILL -f "$work/" 2>/dev/null  # (this sitting's units alone: each names its work folder)
kill "$smi" 2>/dev/null

# the new lines of each ledger copy (after the committed ones), every scores line, the logs
n=$(wc -l <"$LEDGER")
for f in "$work"/ledger-*.jsonl; do tail -n +"$((n + 1))" "$f"; done >"$OUTDIR/ledger-new.jsonl"
cat "$work"/scores-*.jsonl >"$OUTDIR/scores-new.jsonl" 2>/dev/null
{
    echo "== units"; cat "$work/units.log" 2>/dev/null
    echo "== supernet progress"; for f in "$work"/sn/*/training.json; do echo "$f"; grep -E '"(steps|subnet_passes|seconds|done)"' "$f"; done
    echo "== nvidia-smi"; cat "$work/smi.log"
    for f in "$work"/out-*.txt; do echo "== $f"; tail -n 25 "$f"; done
} >>"$log" 2>&1
echo "done at $(($(date +%s) - start))s: $(wc -l <"$OUTDIR/ledger-new.jsonl") ledger lines, $(wc -l \
    <"$OUTDIR/scores-new.jsonl") scores lines" | tee -a "$log"
