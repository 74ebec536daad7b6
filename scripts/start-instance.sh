#!/usr/bin/env bash
# Start one instance of a service in the background and wait until it reads its share of the input.
#
#   scripts/start-instance.sh RUN_DIR NAME COMMAND [ARGS...]
#
# The instance's settings come from the environment (KAFKA_BOOTSTRAP_SERVERS, INPUT_TOPIC, ...). Its
# pid goes to RUN_DIR/NAME.pid and its JSON logs to RUN_DIR/NAME.log. Returns once the instance has
# joined the consumer group and reads partitions (or, after 30 s, holds an empty share: the group
# may have fewer partitions than instances), or fails if it exits first.
set -euo pipefail
RUN_DIR=$1 NAME=$2
shift 2
mkdir -p "$RUN_DIR"
LOG="$RUN_DIR/$NAME.log"
: >"$LOG"
setsid "$@" >>"$LOG" 2>&1 &
PID=$!
echo "$PID" >"$RUN_DIR/$NAME.pid"
# The cooperative protocol assigns in two rounds: the first is often empty for a newcomer.
for i in $(seq 1200); do
    if grep -q '"partitions assigned", "partitions": \[[0-9]\|"partitions": \[[0-9][^]]*\], "gained"' "$LOG" \
        || { [ "$i" -gt 300 ] && grep -q '"partitions assigned"' "$LOG"; }; then
        echo "$NAME (pid $PID) reads: $(grep '"partitions assigned"' "$LOG" | tail -n 1 | sed -E 's/.*"partitions": (\[[^]]*\]).*/\1/')"
        exit 0
    fi
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "$NAME exited before joining its group; last lines of $LOG:" >&2
        tail -n 5 "$LOG" >&2
        exit 1
    fi
    sleep 0.1
done
echo "$NAME did not join its group within 120 s (see $LOG)" >&2
exit 1
