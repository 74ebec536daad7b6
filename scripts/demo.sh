#!/usr/bin/env bash
# The main job, end to end on the embedded broker: generate a detector service from the template,
# start Tansu, feed it sample records (some of them bad), run the service until it has caught up,
# and print the detections and the dead letters.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
WORK=.demo
SERVICE=high-value-orders
COUNT=${COUNT:-5000}

rm -rf "$WORK" && mkdir -p "$WORK"
echo "== generating the $SERVICE service from the template into $WORK/$SERVICE"
"$BIN/cookiecutter" . --no-input -o "$WORK" service_name="$SERVICE"
"$BIN/python" -m pip install -q --no-deps --no-build-isolation -e "$WORK/$SERVICE"

echo "== starting the embedded broker (Tansu)"
"$BIN/detectorkit" broker >"$WORK/broker.out" 2>&1 &
BROKER=$!
trap 'kill $BROKER 2>/dev/null; wait $BROKER 2>/dev/null' EXIT
for _ in $(seq 100); do [ -s "$WORK/broker.out" ] && break; sleep 0.1; done
BOOTSTRAP=$(head -n 1 "$WORK/broker.out")
echo "   bootstrap servers: $BOOTSTRAP"

echo "== producing $COUNT sample records to records.normalized (every 50th is bad)"
"$BIN/detectorkit" produce-sample --bootstrap-servers "$BOOTSTRAP" --topic records.normalized --count "$COUNT" --create

echo "== running the service until it has caught up (its JSON logs: $WORK/job.log)"
KAFKA_BOOTSTRAP_SERVERS="$BOOTSTRAP" CREATE_TOPICS=true STARTING_OFFSETS=earliest STOP_AFTER_IDLE_SECONDS=3 \
    "$BIN/$SERVICE" 2>"$WORK/job.log"
grep '"job stopped"' "$WORK/job.log"

echo "== first 5 detections on 'detections'"
"$BIN/detectorkit" tail --bootstrap-servers "$BOOTSTRAP" --topic detections --max 5
echo "== first 8 dead letters on '$SERVICE.dlq' (reason in headers.error_type)"
"$BIN/detectorkit" tail --bootstrap-servers "$BOOTSTRAP" --topic "$SERVICE.dlq" --max 8
echo "== totals"
"$BIN/python" - "$BOOTSTRAP" "$SERVICE" <<'PY'
import collections, sys
from detectorkit.kafka import clients
from detectorkit.kafka.topic_reader import read_topic
base = clients.base(sys.argv[1])
inputs = sum(1 for _ in read_topic(base, "records.normalized"))
out = sum(1 for _ in read_topic(base, "detections"))
dead = collections.Counter(m["headers"]["error_type"] for m in read_topic(base, f"{sys.argv[2]}.dlq"))
print(f"records in: {inputs}, detections: {out}, dead letters: {sum(dead.values())} {dict(dead)}")
PY
