#!/usr/bin/env bash
# The runtime's tests and the template's at once, each on a broker of its own: most of either lane
# waits (a broker or a JVM starting, a rebalance, a job going idle), so together they take about
# the longer one's time, not their sum. The template's output follows the runtime's, whole.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp -t template-lane.XXXXXX)
make --no-print-directory test-template >"$log" 2>&1 &
template=$!
make --no-print-directory test-runtime
runtime=$?
wait "$template"
template_status=$?
echo "== the template's tests (run beside the runtime's)"
cat "$log"
rm -f "$log"
echo "== runtime lane exit $runtime, template lane exit $template_status"
[ "$runtime" -eq 0 ] && [ "$template_status" -eq 0 ]
