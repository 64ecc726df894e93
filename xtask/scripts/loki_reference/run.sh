#!/usr/bin/env bash
# Runs the Loki artifact's own simulator (UMass-LIDS/Loki, commit e6bb80c, src/simulator) on
# the same requests and fan-outs as examples/experiments/loki-vs-artifact.toml, so that its
# numbers and sluice's can be read side by side (docs/results/loki/README.md, "The artifact's
# own simulator on our requests"). Not part of CI: it clones the artifact from GitHub and
# takes ~1 min (Loki) and ~30 min (Proteus, over the first 144 s) on this machine.
#
#   xtask/scripts/loki_reference/run.sh WORKDIR [loki|proteus ...]      (default: both)
#   DURATION_S=144 xtask/scripts/loki_reference/run.sh WORKDIR proteus   (the requests before 144 s)
#
# Each run prints the artifact's own summary (its SLO violation ratio counts every
# intermediate request at every task, sink included) and the client-level ratio sluice reports
# (clients with any request dropped; the artifact serves nothing late), written to WORKDIR/RUN.summary.
#
# What it changes in the artifact, and why:
# - gurobipy is replaced by shim/gurobipy (HiGHS): the pip wheel's licence refuses these models.
#   The Proteus ILP's solves are capped at SHIM_TIME_LIMIT=2 s (its own limit is 500 s at a 50%
#   gap, which Gurobi proves fast and HiGHS does not); the incumbent is taken.
# - run.py's GRB_LICENSE_FILE line is commented out (no licence file).
# - Its trace and branching files are not in the artifact: the trace is make_requests.py's
#   (peak 100 req/s), the branching files hold each detector's expected outputs rounded up as
#   its smooth_branching.py does (the same integers sluice's experiment file uses).
# - quiet.py runs it with its per-request printing off and one debug-logging lookup replaced
#   by the bare lookup (same results, measured: identical summaries; 5-10x faster).
# trace.py runs it as quiet.py does with every enqueue, batch, drop and routing-table rebuild
# written out, and trace_report.py sums such a trace up (docs/results/loki/README.md has the
# command).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:?usage: run.sh WORKDIR [loki|proteus ...]}"
shift
runs=("${@:-loki proteus}")
mkdir -p "$work"
if [ ! -d "$work/Loki" ]; then
    git clone -q https://github.com/UMass-LIDS/Loki "$work/Loki"
    git -C "$work/Loki" checkout -q e6bb80c
fi
if [ ! -x "$work/venv/bin/python" ]; then
    python3 -m venv "$work/venv"
    # Versions that still have np.int and DataFrame.iteritems, which the artifact uses.
    "$work/venv/bin/pip" install -q numpy==1.23.5 pandas==1.5.3 scipy==1.10.1 'matplotlib<3.8' \
        gym==0.26.2 grpcio requests networkx highspy
fi
sim="$work/Loki/src/simulator"
sed -i 's|^os.environ\["GRB_LICENSE_FILE"\]|# &|' "$sim/run.py"
for d in reward latency throughput throughput_per_model ilp inferline log_ilp_accuracy \
         per_predictor pipeline_ilp request_times; do
    mkdir -p "$sim/logs/$d"
done
duration="${DURATION_S:-288}"
trace="$sim/traces/maf/traffic_$duration"
mkdir -p "$trace/branching_smoothed"
python3 "$here/make_requests.py" 100 "$trace/traffic_analysis.txt" --duration "$duration"
# variant car faces: factor x branch ratio of profiling/profiled/branching.csv, rounded up.
while read -r v car face; do
    {
        echo ',frame,car_classification,facial_recognition'
        for i in $(seq 0 1000); do echo "$i,$i,$car,$face"; done
    } > "$trace/branching_smoothed/$v.csv"
done <<'EOF'
yolov5n 2 1
yolov5s 6 1
yolov5m 14 1
yolov5l 18 1
yolov5x 18 2
EOF
mkdir -p "$sim/configs/cmp"
for r in ${runs[*]}; do
    case "$r" in
        loki) base=pipeline_offline ;;
        proteus) base=proteus ;;
        *) echo "unknown run $r (loki or proteus)" >&2; exit 2 ;;
    esac
    python3 - "$sim/configs/traffic_analysis/$base.json" "$sim/configs/cmp/$r.json" "$r" \
        "traces/maf/traffic_$duration" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c['trace_path'] = sys.argv[4]
c['branching_trace_path'] = sys.argv[4] + '/branching_smoothed'
c['log_path'] = f'cmp/{sys.argv[3]}_peak100.csv'
json.dump(c, open(sys.argv[2], 'w'), indent=1)
EOF
    echo "== $r ($duration s)"
    (cd "$sim" && SHIM_TIME_LIMIT=2 LOKI_DROPS="$work/$r.drops" PYTHONPATH="$here/shim:$work/Loki/src" \
        "$work/venv/bin/python" "$here/quiet.py" --config_file "configs/cmp/$r.json" 2>"$work/$r.log" |
        grep -a "^Overall\|^Total\|^Dropped\|^Late\|^SLO violations" | sort -u > "$work/$r.summary")
    clients=$(sed -n 's/^Total parent requests: //p' "$work/$r.summary")
    failed=$(sort -u "$work/$r.drops" | wc -l)
    echo "Clients with a drop: $failed of $clients ($(python3 -c "print(round($failed / $clients, 4))"))" >> "$work/$r.summary"
    cat "$work/$r.summary"
done
