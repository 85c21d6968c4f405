#!/usr/bin/env bash
# Every benchmark (docs/benchmarks.md), one JSON line per figure on stdout, also appended to
# $BENCH_OUT when set. Installs the project with the `bench` extra (kafka-python, py-spy) first if
# kafka-python is missing. `scripts/bench_all.sh --quick` runs the CI sizes in about three minutes;
# without it the full sizes take about an hour on 2 busy cores (capacity and cluster_capacity
# each hold 5 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import kafka, trio" 2>/dev/null; then
    EXTRAS=${EXTRAS:-test,dev,spark,bench} scripts/bootstrap.sh
fi
out=${BENCH_OUT:-/dev/null}
for bench in assignment heartbeat capacity cluster_capacity rebalance incremental tls detection failover zk_commits seed02; do
    echo "== bench.$bench $*" >&2
    .venv/bin/python -m "bench.$bench" "$@" | tee -a "$out"
done
# These two take sizes rather than --quick.
sizes=()
if [ "${1:-}" = "--quick" ]; then sizes=(--records 20000); fi
for bench in throughput spark_source; do
    echo "== bench.$bench ${sizes[*]}" >&2
    .venv/bin/python -m "bench.$bench" "${sizes[@]}" | tee -a "$out"
done
