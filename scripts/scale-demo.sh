#!/usr/bin/env bash
# The talk's demo: one detector service scaled out and in on Apache Kafka, showing each instance's
# share of the work.
#
#   make scale-demo      (RECORDS=1000000 PARTITIONS=4 ENGINE=kafka CORES=1 RATE=10000 by default)
#
# Each instance gets CORES cores (SPARK_MASTER=local[CORES]): with 1, two instances use a 2-core
# machine as two one-core pods would. Three phases on a PARTITIONS-partition topic:
#   1. one instance: 40% of RECORDS produced at once; instance 1 reads them all.
#   2. two instances: instance 2 starts; once the group has given both instances partitions,
#      another 40% is produced at once, and each instance reads its partitions' share.
#   3. scale-in while records flow: the last 20% at RATE records/s; instance 2 stops gracefully
#      halfway, instance 1 takes its partitions back and reads the rest.
# Why batches and not one paced stream: starting an instance takes ~20 s here, in which instance 1
# reads on alone whatever a producer sends (one core reads ~80k records/s; the first version of this
# demo: instance 1 read all 1,000,000 records, instance 2 none), and a producer fast enough to
# outrun an instance takes a core of a 2-core machine itself. Each phase is read to its end before
# the next starts, so the instances are idle in between and their metric snapshots count every
# phase exactly.
#
# The report: records read per instance in each phase with its records/s and the phase's
# throughput (one instance, then two), the metrics-aggregator's `records read` minus the records
# produced (records processed twice would show here; it must be 0), the detections written twice,
# and how long each hand-over took. It fails if an instance read nothing in a phase it ran through.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/.venv/bin
WORK=$PWD/.scale-demo
SERVICE=high-value-orders
RECORDS=${RECORDS:-1000000}
PARTITIONS=${PARTITIONS:-4}
ENGINE=${ENGINE:-kafka}
CORES=${CORES:-1}
RATE=${RATE:-10000}
RUN=$WORK/run
PHASES=$WORK/phases
ONE=$((RECORDS * 2 / 5)) TWO=$((RECORDS * 2 / 5))
LAST=$((RECORDS - ONE - TWO))

rm -rf "$WORK" && mkdir -p "$RUN" && : >"$PHASES"
echo "== generating the $SERVICE service from the template"
"$BIN/cookiecutter" . --no-input -o "$WORK" service_name="$SERVICE" >/dev/null
"$BIN/python" -m pip install -q --no-deps --no-build-isolation -e "$WORK/$SERVICE"

echo "== starting the broker ($ENGINE) with records.normalized ($PARTITIONS partitions)"
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
export KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP STARTING_OFFSETS=earliest METRICS_INTERVAL_SECONDS=1 SPARK_MASTER="local[$CORES]"
unset INSTANCE_ID HEALTH_PORT  # dynamic members (partitions move the moment one stops); a free health port each

"$BIN/detectorkit" aggregate --bootstrap-servers "$BOOTSTRAP" --port 0 --interval-seconds 1 >"$WORK/aggregator.log" 2>&1 &
AGGREGATOR=$!

report() { "$BIN/python" -m detectorkit.devtools.scale_report "$@"; }
produce() { report produce "$BOOTSTRAP" "$@"; }  # COUNT SEED [RATE]: sample records, 1 in 1,000 bad
now() { date +%s.%N; }

echo "== instance 1 starts ($CORES core(s))"
scripts/start-instance.sh "$RUN" instance-1 "$BIN/$SERVICE"

echo "== phase 1: $ONE records produced at once; instance 1 reads them alone"
START=$(now)
produce "$ONE" 1
report wait "$BOOTSTRAP" "$SERVICE" "$ONE" "$PHASES" one-instance "$START" "$ONE"

echo "== instance 2 starts ($CORES core(s))"
scripts/start-instance.sh "$RUN" instance-2 "$BIN/$SERVICE"
report split "$BOOTSTRAP" "$SERVICE" 2 "$RUN"/*.log

echo "== phase 2: $TWO records produced at once; the two instances share them"
START=$(now)
produce "$TWO" 2
report wait "$BOOTSTRAP" "$SERVICE" $((ONE + TWO)) "$PHASES" two-instances "$START" "$TWO"

echo "== phase 3: $LAST records at $RATE/s; instance 2 stops halfway"
START=$(now)
produce "$LAST" 3 "$RATE" &
FEED=$!
sleep "$(awk -v n="$LAST" -v r="$RATE" 'BEGIN { print n / r / 2 }')"  # halfway through the feed
scripts/stop-instance.sh "$RUN" instance-2
wait "$FEED"; FEED=
report wait "$BOOTSTRAP" "$SERVICE" "$RECORDS" "$PHASES" scale-in "$START" "$LAST"
scripts/stop-instance.sh "$RUN" instance-1

echo "== result"
report result "$BOOTSTRAP" "$SERVICE" "$RECORDS" "$WORK/aggregator.log" "$PHASES" "$RUN"/*.log
