#!/usr/bin/env bash
# Rolling redeploy of a service's instances on one host, one instance at a time: start the new
# version's instance, wait until the group has given it partitions, then stop the old instance
# gracefully. The old instance finishes and commits its batch before its partitions move, so
# nothing is lost and nothing is processed twice; the other instances and services run on.
#
#   scripts/rolling-redeploy.sh RUN_DIR COMMAND [ARGS...]
#
# RUN_DIR holds the running instances' NAME.pid files (from scripts/start-instance.sh); COMMAND is
# the new version's. Instance NAME is replaced by NAME-next-<n>, keeping RUN_DIR's layout.
set -euo pipefail
HERE=$(dirname "$0")
RUN_DIR=$1
shift
STAMP=$(date +%s)
for pidfile in "$RUN_DIR"/*.pid; do
    [ -e "$pidfile" ] || { echo "no running instance in $RUN_DIR" >&2; exit 1; }
    old=$(basename "$pidfile" .pid)
    new="${old%-next-*}-next-$STAMP"
    echo "== replacing $old by $new"
    "$HERE/start-instance.sh" "$RUN_DIR" "$new" "$@"
    "$HERE/stop-instance.sh" "$RUN_DIR" "$old"
done
echo "== every instance runs the new version"
