#!/bin/sh
# Usage: read_only_node.sh HOST FOLDER COMMAND...
# Run COMMAND; on the simulated node whose host name is HOST, in a mount namespace of its own where FOLDER is
# read-only (a bind mount of it over itself, remounted read-only): that node alone cannot write FOLDER.
host="$1"
folder="$2"
shift 2
if [ "$(hostname)" = "$host" ]; then
  exec unshare --mount /bin/sh -c 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"' "$folder" "$@"
fi
exec "$@"
