#!/usr/bin/env bash
# Issue 25's demo, on one machine: three clade nodes, each in a network
# namespace of its own (a bridge and a veth each, 10.250.250.0/24, no route
# anywhere else), forming one cluster over a 3-member etcd embedded in the
# daemons, with a real S3 object store (SeaweedFS's weed, on the bridge).
# A sandbox is created through node 1, forked 6 across all three nodes,
# slept; node 1 is SIGKILLed, and a request through node 3's ingress wakes
# the sandbox on another node with its files and processes. Then node 1
# comes back and finds what the cluster moved or lost fenced. Everything
# is cleaned up at the end, a failed run too.
set -euo pipefail
BIN=$(realpath "${BIN:-bin}")
IMAGES_DIR=${IMAGES_DIR:-/var/cache/clade/images}
RUNSC=${RUNSC:-}
WORK=$(mktemp -d /tmp/clade-democluster.XXXXXX)
BR=cdemo0
NET=10.250.250
PEERS="n1=http://$NET.11:2380,n2=http://$NET.12:2380,n3=http://$NET.13:2380"
S3PORT=18333 # weed's S3 gateway on the bridge's host address
DOMAIN=clade.test
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
on() { local k=$1; shift; "$BIN/clade" --host "$WORK/n$k.sock" "$@"; }
# wait_for SECONDS WHAT CMD...: run CMD until it succeeds, at most SECONDS.
wait_for() {
	local n=$(($1 * 5)) what=$2
	shift 2
	until "$@" >/dev/null 2>&1; do
		n=$((n - 1))
		[ "$n" -gt 0 ] || { echo "timed out waiting for $what" >&2; return 1; }
		sleep 0.2
	done
}
declare -A PID
WEED=

cleanup() {
	set +e
	for k in 1 2 3; do
		[ -n "${PID[$k]:-}" ] || continue
		kill -0 "${PID[$k]}" 2>/dev/null || continue
		for id in $(on "$k" ls -q --node "n$k" 2>/dev/null); do on "$k" rm -f "$id" >/dev/null 2>&1; done
	done
	for k in 1 2 3; do [ -n "${PID[$k]:-}" ] && kill "${PID[$k]}" 2>/dev/null; done
	for k in 1 2 3; do [ -n "${PID[$k]:-}" ] && wait "${PID[$k]}" 2>/dev/null; done
	[ -n "$WEED" ] && kill -- "-$WEED" 2>/dev/null && wait "$WEED" 2>/dev/null
	for k in 1 2 3; do ip link del "cdemo$k" 2>/dev/null; ip netns del "cdemo$k" 2>/dev/null; done
	ip link del "$BR" 2>/dev/null
	grep -o " $WORK[^ ]*" /proc/self/mountinfo | xargs -r -n1 umount -l 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || { echo "demo-cluster makes network namespaces: run it as root" >&2; exit 1; }
[ -x "$BIN/weed" ] || { echo "no $BIN/weed: run make deps-weed first" >&2; exit 1; }
printf 'demo-cluster-token-%s\n' "$RANDOM$RANDOM" > "$WORK/token"
chmod 600 "$WORK/token"

say "three network namespaces on a bridge $BR ($NET.0/24)"
ip link add "$BR" type bridge
ip addr add "$NET.1/24" dev "$BR"
ip link set "$BR" up
for k in 1 2 3; do
	ip netns add "cdemo$k"
	ip link add "cdemo$k" type veth peer name eth0 netns "cdemo$k"
	ip link set "cdemo$k" master "$BR" up
	ip -n "cdemo$k" addr add "$NET.1$k/24" dev eth0
	ip -n "cdemo$k" link set eth0 up
	ip -n "cdemo$k" link set lo up
done

say "an S3 object store: SeaweedFS on $NET.1:$S3PORT, bucket clade-demo"
AK=demo$RANDOM$RANDOM
SK=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
mkdir -p "$WORK/weed"
printf 'AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n' "$AK" "$SK" > "$WORK/s3.creds"
chmod 600 "$WORK/s3.creds"
(cd "$WORK/weed" && exec setsid env AWS_ACCESS_KEY_ID="$AK" AWS_SECRET_ACCESS_KEY="$SK" HOME="$WORK/weed" "$BIN/weed" server \
	-ip="$NET.1" -ip.bind="$NET.1" -dir="$WORK/weed" -master.port=18330 -master.port.grpc=18331 -master.telemetry=false \
	-master.volumeSizeLimitMB=256 -volume.port=18332 -volume.port.grpc=18334 -volume.max=0 \
	-filer -filer.port=18335 -filer.port.grpc=18336 -s3 -s3.port="$S3PORT" -s3.port.grpc=18337 \
	-s3.port.iceberg=0 -s3.port.lance=0) >"$WORK/weed.log" 2>&1 &
WEED=$!
mkbucket() { curl -fsS --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AK:$SK" -X PUT "http://$NET.1:$S3PORT/clade-demo"; }
wait_for 120 "the S3 gateway" mkbucket || { tail -20 "$WORK/weed.log"; exit 1; }

say "three daemons, one etcd member in each (--cluster embed --cluster-peers), each with --object-store and an ingress; logs in $WORK"
start() {
	local k=$1
	local args=(daemon --cluster embed --cluster-peers "$PEERS" --node "n$k" --listen "$NET.1$k:7070" --token-file "$WORK/token"
		--cluster-listen "$NET.1$k:2379" --cluster-peer-listen "$NET.1$k:2380" --cluster-lease-ttl 3s
		--data-dir "$WORK/n$k" --socket "$WORK/n$k.sock" --images-dir "$IMAGES_DIR" --build-default-image=false
		--network-prefix "cdm$k" --network-range "10.203.$k.0/24" --dns-upstream none --warm-pool 0 --hot-pool 0
		--object-store "s3://clade-demo?endpoint=http://$NET.1:$S3PORT" --object-store-credentials "$WORK/s3.creds"
		--ingress "$NET.1$k:8080" --ingress-domain "$DOMAIN")
	[ -n "$RUNSC" ] && args+=(--runsc "$RUNSC")
	nsenter --net=/run/netns/"cdemo$k" "$BIN/clade" "${args[@]}" >>"$WORK/n$k.log" 2>&1 &
	PID[$k]=$!
}
for k in 1 2 3; do start "$k"; done
for k in 1 2 3; do
	until on "$k" node ls >/dev/null 2>&1; do
		kill -0 "${PID[$k]}" 2>/dev/null || { cat "$WORK/n$k.log"; exit 1; }
		sleep 0.2
	done
done
on 1 node ls

say "a sandbox through n1: a file, a process counting every 100 ms, a web server on port 8000"
on 1 create --name web --node n1 --public >/dev/null
on 1 exec web -- sh -c 'mkdir -p /tmp/www; echo "made on n1" > /tmp/www/hello
setsid sh -c "i=0; while :; do i=\$((i+1)); echo \$i > /tmp/www/count; sleep 0.1; done" >/dev/null 2>&1 </dev/null &
setsid python3 -m http.server 8000 --bind 127.0.0.1 -d /tmp/www >/dev/null 2>&1 </dev/null &
for i in $(seq 200); do python3 -c "import socket; socket.create_connection((\"127.0.0.1\", 8000)).close()" 2>/dev/null && exit 0; sleep 0.05; done; exit 1'
on 1 ls

say "fork web into 6 children across all three nodes (--spread): the others fetch its snapshot by digest"
on 3 fork web -n 6 --spread --json | tee "$WORK/fork.json" | python3 -c '
import json, sys
r = json.load(sys.stdin)
for c in r["children"]:
    print(" ", c.get("id", "-"), "on", c.get("node", "?"), c.get("error", ""))'
for id in $(python3 -c 'import json; print(" ".join(c["id"] for c in json.load(open("'"$WORK/fork.json"'"))["children"] if c.get("id")))'); do
	printf '  %s: %s, count %s\n' "$id" "$(on 2 exec "$id" -- cat /tmp/www/hello)" "$(on 2 exec "$id" -- cat /tmp/www/count)"
done
on 1 ls

say "sleep web (to zero RAM); its sleep image goes to the object store"
on 1 exec web -- cat /tmp/www/count | sed 's/^/  count before the sleep: /'
on 1 sleep web
sleep_image() { on 2 inspect web | python3 -c 'import json, sys; sys.exit(0 if json.load(sys.stdin).get("sleep_image") else 1)'; }
wait_for 180 "web's sleep image in the object store" sleep_image
on 2 inspect web | python3 -c 'import json, sys; s = json.load(sys.stdin); print("  web:", s["state"], "on", s["node"], "image copy", s["sleep_image"][:19] + "...")'

say "SIGKILL n1 (its daemon and etcd member): 2 of 3 etcd members serve on"
kill -9 "${PID[1]}"
wait "${PID[1]}" 2>/dev/null || true
n1_gone() { ! on 3 node ls 2>/dev/null | grep -q '^n1 '; }
wait_for 60 "n1 to leave the cluster" n1_gone
on 3 node ls

say "a request through n3's ingress wakes web on another node"
t0=$(date +%s%N)
curl -fsS --max-time 300 -H "Host: 8000-web.$DOMAIN" "http://$NET.13:8080/hello"
curl -fsS --max-time 60 -H "Host: 8000-web.$DOMAIN" "http://$NET.13:8080/count" | sed 's/^/  count after the wake: /'
echo "  ($(( ($(date +%s%N) - t0) / 1000000 )) ms for both requests, the move and the wake included)"
on 3 ls

say "n1 back: what the cluster moved or declared lost is fenced, and n1 removes its copies"
start 1
until on 1 node ls >/dev/null 2>&1; do sleep 0.2; done
n1_clean() { on 1 node ls --json | python3 -c 'import json, sys; sys.exit(0 if [n for n in json.load(sys.stdin) if n["name"] == "n1" and n["capacity"]["sandboxes"] == 0] else 1)'; }
wait_for 120 "n1 to remove what it no longer holds" n1_clean
grep -h 'cluster: fenced' "$WORK/n1.log" | sed -E 's/.*sandbox=([0-9a-f]+).*/  n1: fenced, stopped and removed its copy of \1/'
on 1 node ls
on 1 ls
for id in $(on 2 ls | awk '$5 == "lost" { print $1 }'); do
	on 2 rm "$id" >/dev/null && echo "removed lost $id"
done
say "done; cleaning up"
