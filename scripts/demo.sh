#!/usr/bin/env bash
# The main job end to end: a daemon, a sandbox, Python in it, files in and out.
set -euo pipefail
BIN=${BIN:-bin}
DATA_DIR=${DATA_DIR:-/var/lib/clade}
IMAGES_DIR=${IMAGES_DIR:-/var/cache/clade/images}
SOCK=$(mktemp -u /tmp/clade-demo.XXXXXX.sock)
LOG=$(mktemp /tmp/clade-demo.XXXXXX.log)
export CLADE_HOST=$SOCK
clade() { "$BIN/clade" "$@"; }

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

say "starting the daemon (data in $DATA_DIR, log in $LOG)"
"$BIN/clade" daemon --data-dir "$DATA_DIR" --images-dir "$IMAGES_DIR" --socket "$SOCK" >"$LOG" 2>&1 &
DAEMON=$!
SB=""
cleanup() {
	[ -n "$SB" ] && clade rm -f "$SB" >/dev/null 2>&1 || true
	kill "$DAEMON" 2>/dev/null || true
	wait "$DAEMON" 2>/dev/null || true
	rm -f "$SOCK"
}
trap cleanup EXIT
until clade ls >/dev/null 2>&1; do
	kill -0 "$DAEMON" 2>/dev/null || { cat "$LOG"; exit 1; }
	sleep 0.1
done

say "waiting for the default image (built once with debootstrap: a few minutes the first time)"
until clade image ls | grep -q '^default '; do
	kill -0 "$DAEMON" 2>/dev/null || { cat "$LOG"; exit 1; }
	grep -q "building the default image failed" "$LOG" && { cat "$LOG"; exit 1; }
	sleep 2
done
clade image ls

say "clade create --name demo"
time SB=$(clade create --name "demo-$$")
echo "$SB"
clade ls

say "clade exec: Python inside the sandbox"
clade exec "$SB" -- python3 -c 'import platform, socket; print("hello from", socket.gethostname(), "python", platform.python_version())'

say "clade cp: a file in, processed, and back out"
WORK=$(mktemp -d)
printf 'the quick brown fox\njumps over the lazy dog\n' > "$WORK/words.txt"
clade cp "$WORK/words.txt" "$SB:/root/words.txt"
clade exec "$SB" -- python3 -c 'import collections; t = open("/root/words.txt").read().split(); c = collections.Counter("".join(t)).most_common(1)[0][0]; open("/root/count.txt", "w").write("%d words, most common letter: %s\n" % (len(t), c))'
clade cp "$SB:/root/count.txt" "$WORK/count.txt"
cat "$WORK/count.txt"
rm -rf "$WORK"

say "clade fork: a running process and its memory, into 3 children in one call"
clade exec "$SB" -- sh -c 'nohup python3 -c "
import time
n = 0
while True:
    n += 1
    open(\"/tmp/count\", \"w\").write(str(n))
    time.sleep(0.1)
" > /dev/null 2>&1 & until [ -s /tmp/count ]; do sleep 0.05; done'
time KIDS=$(clade fork "$SB" -n 3)
for k in $KIDS; do
	printf 'child %s: counter %s (it kept counting from the parent'"'"'s value)\n' "$k" "$(clade exec "$k" -- cat /tmp/count)"
done
clade rm $KIDS >/dev/null

say "clade sleep: to disk, no RAM; clade wake: same id, same process"
clade sleep "$SB" >/dev/null
clade ls
time clade wake "$SB" >/dev/null
echo "counter after wake: $(clade exec "$SB" -- cat /tmp/count)"

say "clade exec: exit codes pass through"
set +e
clade exec "$SB" -- sh -c 'exit 3'
echo "exit code: $?"
set -e

say "clade rm"
clade rm "$SB"
SB=""
clade ls
say "done"
