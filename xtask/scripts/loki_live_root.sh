#!/usr/bin/env bash
# The live traffic-analysis pipeline (examples/loki-traffic.toml) under open-loop load,
# with the root served by the front-end table or as the Loki artifact serves it
# (root_dispatch = "queue-aware", root_budget = "slo-per-stage"), with the plans'
# demand factor at 1 (the paper's) or 1.2 (`beta`), and the tables filling workers to
# 100% or 80% of their capacity (`routing_utilization`; β 1.2 and 80% are the other
# Loki experiments' setting and the example's). Manual, not CI;
# results are in docs/results/loki/README.md, "The artifact's root in the live host".
#
#   cargo build --release -p sluice && cargo xtask policies
#   xtask/scripts/loki_live_root.sh [RATE=60] [SECONDS=20]
#
# Prints, per setting, the client counters of GET /admin/pipelines/traffic (on time;
# partial: some of it served, not all of it by the SLO; dropped: nothing served) and
# each task's drops.
set -euo pipefail
rate=${1:-60}
seconds=${2:-20}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
port=18085
export SLUICE_ADMIN_TOKEN=loki-live-root

for setting in "1 table 1.0" "1 artifact 1.0" "1.2 table 1.0" "1.2 artifact 1.0" "1.2 table 0.8" "1.2 artifact 0.8"; do
    read -r beta rootmode utilization <<< "$setting"
    config="$work/$beta-$rootmode-$utilization.toml"
    sed -e "s|^listen = .*|listen = \"127.0.0.1:$port\"|" \
        -e "s|^policy_dir = .*|policy_dir = \"$work/policies\"|" \
        -e "s|^builtin_policy_dir = .*|builtin_policy_dir = \"$root/target/policies\"|" \
        -e "s|^problem = \"|problem = \"$root/examples/|" \
        -e "/^beta = /d" -e "/^routing_utilization = /d" \
        "$root/examples/loki-traffic.toml" > "$config"
    printf 'beta = %s\nrouting_utilization = %s\n' "$beta" "$utilization" >> "$config"
    if [ "$rootmode" = artifact ]; then
      printf 'root_dispatch = "queue-aware"\nroot_budget = "slo-per-stage"\n' >> "$config"
    fi
    "$root/target/release/sluice" serve --config "$config" > "$work/serve.log" 2>&1 &
    server=$!
    for _ in $(seq 1 100); do
      curl -sf "http://127.0.0.1:$port/v2/health/ready" > /dev/null && break
      sleep 0.2
    done
    "$root/target/release/sluice" loadgen --addr "127.0.0.1:$port" --app traffic \
      --rate "$rate" --concurrency 64 --duration "$seconds" --json > "$work/loadgen.json"
    curl -s -H "Authorization: Bearer $SLUICE_ADMIN_TOKEN" \
      "http://127.0.0.1:$port/admin/pipelines/traffic" > "$work/status.json"
    kill "$server"
    wait "$server" 2> /dev/null || true
    python3 - "$beta" "$rootmode" "$utilization" "$work/status.json" <<'EOF'
import json, sys
beta, mode, utilization, path = sys.argv[1:]
s = json.load(open(path))
c = s["counters"]
n = max(c["accepted"], 1)
print(f"beta {beta:>3}  root {mode:<8}  filling {utilization}  accepted {c['accepted']}  on time {c['on_time'] / n:.3f}"
      f"  partial {c['partial'] / n:.3f}  dropped {c['dropped'] / n:.3f}")
for t in s["tasks"]:
    print(f"    {t['task']:<20} created {t['created']:>6}  dropped {t['dropped'] / max(t['created'], 1):.3f}")
EOF
done
