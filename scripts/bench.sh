#!/usr/bin/env bash
# `make bench`: a daemon of its own on a scratch data dir, a quick default
# `clade bench --baseline` run, the result in bench.json, everything removed.
set -euo pipefail
BIN=${BIN:-bin}
IMAGES_DIR=${IMAGES_DIR:-/var/cache/clade/images}
WORK=$(mktemp -d /tmp/clade-bench.XXXXXX)
SOCK=$WORK/clade.sock
"$BIN/clade" daemon --data-dir "$WORK/data" --images-dir "$IMAGES_DIR" --socket "$SOCK" --memory-overcommit 4 --network-prefix cbench --network-range 10.199.0.0/16 >"$WORK/daemon.log" 2>&1 &
DAEMON=$!
cleanup() {
	kill "$DAEMON" 2>/dev/null || true
	wait "$DAEMON" 2>/dev/null || true
	grep -o " $WORK[^ ]*" /proc/self/mountinfo | xargs -r -n1 umount -l 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT
until "$BIN/clade" --host "$SOCK" image ls 2>/dev/null | grep -q '^default '; do
	kill -0 "$DAEMON" 2>/dev/null || { cat "$WORK/daemon.log"; exit 1; }
	sleep 0.5
done
"$BIN/clade" --host "$SOCK" bench --baseline --data-dir "$WORK/data" \
	--phases create,exec,snapshot,fork,wake,memfork --fanout 1,4,16 --samples "${SAMPLES:-10}" --warmup 2 \
	--json bench.json "$@"
