#!/usr/bin/env bash
# Stop one instance gracefully: SIGTERM, then wait while it finishes its batch in flight, commits it
# and leaves the consumer group (its partitions move to the other instances at once).
#
#   scripts/stop-instance.sh RUN_DIR NAME
set -euo pipefail
RUN_DIR=$1 NAME=$2
PID=$(cat "$RUN_DIR/$NAME.pid")
kill -TERM "$PID" 2>/dev/null || { rm -f "$RUN_DIR/$NAME.pid" "$RUN_DIR/$NAME.port"; exit 0; }
for _ in $(seq 3000); do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$PID" 2>/dev/null; then
    echo "$NAME (pid $PID) did not stop within 300 s" >&2
    exit 1
fi
rm -f "$RUN_DIR/$NAME.pid" "$RUN_DIR/$NAME.port"
grep -q '"job stopped"' "$RUN_DIR/$NAME.log" || { echo "$NAME did not stop cleanly; see $RUN_DIR/$NAME.log" >&2; exit 1; }
echo "$NAME stopped: $(grep '"job stopped"' "$RUN_DIR/$NAME.log" | tail -n 1 | sed -E 's/.*("records": [0-9]+).*/\1/')"
