#!/usr/bin/env bash
# Start one instance of a service in the background and wait until it is ready: its health
# endpoint's /ready answers 200 once the instance has joined the consumer group and reads what the
# group gave it (as a Kubernetes readiness probe sees it).
#
#   scripts/start-instance.sh RUN_DIR NAME COMMAND [ARGS...]
#
# The instance's settings come from the environment (KAFKA_BOOTSTRAP_SERVERS, INPUT_TOPIC, ...).
# HEALTH_PORT is its health port; unset (or 0), a free one is picked. Its pid goes to
# RUN_DIR/NAME.pid, its health port to RUN_DIR/NAME.port, its JSON logs to RUN_DIR/NAME.log. Fails
# if the instance exits first, or is not ready within READY_TIMEOUT seconds (default 180).
#
# Ready is not "owns partitions": with the cooperative protocol a newcomer's first assignment is
# often empty (the partitions it gets are first revoked from the others, then given in a second
# round), and an instance of a group with more instances than partitions owns none.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 RUN_DIR NAME COMMAND [ARGS...]" >&2; exit 2; }
RUN_DIR=$1 NAME=$2
shift 2
mkdir -p "$RUN_DIR"
LOG="$RUN_DIR/$NAME.log"
if [ -e "$RUN_DIR/$NAME.pid" ] && kill -0 "$(cat "$RUN_DIR/$NAME.pid")" 2>/dev/null; then
    echo "$NAME already runs (pid $(cat "$RUN_DIR/$NAME.pid"))" >&2
    exit 1
fi
if [ -z "${HEALTH_PORT:-}" ] || [ "$HEALTH_PORT" = 0 ]; then
    HEALTH_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
export HEALTH_PORT
# Loopback unless told otherwise: a dev machine's probe needs no other interface.
export HEALTH_HOST=${HEALTH_HOST:-127.0.0.1}
URL="http://127.0.0.1:$HEALTH_PORT/ready"
: >"$LOG"
setsid "$@" >>"$LOG" 2>&1 &
PID=$!
echo "$PID" >"$RUN_DIR/$NAME.pid"
echo "$HEALTH_PORT" >"$RUN_DIR/$NAME.port"

ready() {
    if command -v curl >/dev/null 2>&1; then
        curl -fsS --max-time 2 "$URL" 2>/dev/null
    else
        python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())' "$URL" 2>/dev/null
    fi
}

began=$SECONDS
while true; do
    if answer=$(ready); then
        echo "$NAME (pid $PID) ready after $((SECONDS - began)) s: $answer"
        exit 0
    fi
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "$NAME exited before it was ready; last lines of $LOG:" >&2
        tail -n 5 "$LOG" >&2
        exit 1
    fi
    if [ $((SECONDS - began)) -ge "${READY_TIMEOUT:-180}" ]; then
        echo "$NAME was not ready within ${READY_TIMEOUT:-180} s ($URL answers: $(curl -sS --max-time 2 "$URL" 2>/dev/null || echo nothing)); see $LOG" >&2
        exit 1
    fi
    sleep 0.2
done
