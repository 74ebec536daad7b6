#!/usr/bin/env bash
# The talk's demo: one detector service scaled out and in while records flow, on Apache Kafka.
#
#   make scale-demo            (RECORDS=1000000 PARTITIONS=4 ENGINE=kafka by default)
#
# 1,000,000 records on a 4-partition topic; instance 1 starts; instance 2 starts while records
# flow; instance 2 stops; instance 1 finishes. Then it prints the metrics-aggregator's `records read`
# minus the records produced (records processed twice would show here; it must be 0), the
# detections written twice, and how long each hand-over took.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/.venv/bin
WORK=$PWD/.scale-demo
SERVICE=high-value-orders
RECORDS=${RECORDS:-1000000}
PARTITIONS=${PARTITIONS:-4}
ENGINE=${ENGINE:-kafka}
RUN=$WORK/run

rm -rf "$WORK" && mkdir -p "$RUN"
echo "== generating the $SERVICE service from the template"
"$BIN/cookiecutter" . --no-input -o "$WORK" service_name="$SERVICE" >/dev/null
"$BIN/python" -m pip install -q --no-deps --no-build-isolation -e "$WORK/$SERVICE"

echo "== starting Apache Kafka ($ENGINE) with records.normalized ($PARTITIONS partitions)"
"$BIN/detectorkit" broker --engine "$ENGINE" --topics records.normalized detections "$SERVICE.dlq" metrics \
    --partitions "$PARTITIONS" >"$WORK/broker.out" 2>"$WORK/broker.log" &
BROKER=$!
AGGREGATOR=
FEED=
cleanup() {
    for pidfile in "$RUN"/*.pid; do [ -e "$pidfile" ] && kill -TERM "$(cat "$pidfile")" 2>/dev/null; done
    [ -n "$FEED" ] && kill "$FEED" 2>/dev/null
    [ -n "$AGGREGATOR" ] && kill "$AGGREGATOR" 2>/dev/null
    sleep 1; kill $BROKER 2>/dev/null; wait 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 1200); do [ -s "$WORK/broker.out" ] && break; kill -0 $BROKER || { cat "$WORK/broker.log"; exit 1; }; sleep 0.1; done
BOOTSTRAP=$(head -n 1 "$WORK/broker.out")
echo "   bootstrap servers: $BOOTSTRAP"
export KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP STARTING_OFFSETS=earliest METRICS_INTERVAL_SECONDS=2 GROUP_SESSION_TIMEOUT_SECONDS=10
unset INSTANCE_ID  # dynamic members: each instance's partitions move the moment it stops

"$BIN/detectorkit" aggregate --bootstrap-servers "$BOOTSTRAP" --port 0 --interval-seconds 2 >"$WORK/aggregator.log" 2>&1 &
AGGREGATOR=$!

echo "== producing $RECORDS records in the background"
"$BIN/detectorkit" produce-sample --bootstrap-servers "$BOOTSTRAP" --topic records.normalized --count "$RECORDS" \
    --bad-every 1000 --rate "${RATE:-10000}" >"$WORK/producer.log" 2>&1 &
FEED=$!

progress() { "$BIN/python" -m detectorkit.devtools.scale_report progress "$BOOTSTRAP" "$SERVICE"; }

echo "== instance 1 starts"
scripts/start-instance.sh "$RUN" instance-1 "$BIN/$SERVICE"
sleep 10; progress
echo "== instance 2 starts while records flow"
scripts/start-instance.sh "$RUN" instance-2 "$BIN/$SERVICE"
sleep 20; progress
echo "== instance 2 stops"
scripts/stop-instance.sh "$RUN" instance-2
wait "$FEED"; FEED=
echo "== all $RECORDS records produced; instance 1 finishes"
"$BIN/python" -m detectorkit.devtools.scale_report wait "$BOOTSTRAP" "$SERVICE" "$RECORDS"
scripts/stop-instance.sh "$RUN" instance-1
echo "== result"
"$BIN/python" -m detectorkit.devtools.scale_report result "$BOOTSTRAP" "$SERVICE" "$RECORDS" "$WORK/aggregator.log" "$RUN"/*.log
