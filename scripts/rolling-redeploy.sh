#!/usr/bin/env bash
# Rolling redeploy of a service's instances on one host, one instance at a time: start the new
# version's instance, wait until it is ready (/ready), then stop the old instance
# gracefully. The old instance finishes and commits its batch before its partitions move, so
# nothing is lost and nothing is processed twice; the other instances and services run on.
#
#   scripts/rolling-redeploy.sh RUN_DIR COMMAND [ARGS...]
#
# RUN_DIR holds the running instances' NAME.pid files (from scripts/start-instance.sh); COMMAND is
# the new version's. Instance NAME is replaced by NAME-next-<n>, keeping RUN_DIR's layout.
set -euo pipefail
if [ -n "${INSTANCE_ID:-}" ]; then
    # The new instance runs beside the old one: with one INSTANCE_ID they would fence each other.
    echo "INSTANCE_ID is set: rolling-redeploy.sh runs the new instance beside the old one, which needs dynamic members;" \
        "unset INSTANCE_ID, or restart static members in place (stop-instance.sh, then start-instance.sh with the same INSTANCE_ID)" >&2
    exit 2
fi
HERE=$(dirname "$0")
RUN_DIR=$1
shift
STAMP=$(date +%s)
for pidfile in "$RUN_DIR"/*.pid; do
    [ -e "$pidfile" ] || { echo "no running instance in $RUN_DIR" >&2; exit 1; }
    old=$(basename "$pidfile" .pid)
    new="${old%-next-*}-next-$STAMP"
    echo "== replacing $old by $new"
    HEALTH_PORT= "$HERE/start-instance.sh" "$RUN_DIR" "$new" "$@"  # a free port: the old instance holds its own
    "$HERE/stop-instance.sh" "$RUN_DIR" "$old"
done
echo "== every instance runs the new version"
