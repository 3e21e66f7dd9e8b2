#!/usr/bin/env bash
# Three clade nodes on one machine, each in a network namespace of its own
# (a bridge and a veth each, 10.250.250.0/24, no route anywhere else),
# forming one cluster over a 3-member etcd embedded in the daemons. It
# shows what the cluster does today: node ls, placement by memory, calls
# through a node that does not hold the sandbox, drain, a node SIGKILLed
# (its sandboxes lost, never recreated; 2 of 3 etcd members serve on),
# and cleans everything up. Cross-node fork and wake-anywhere are to come.
set -euo pipefail
BIN=$(realpath "${BIN:-bin}")
IMAGES_DIR=${IMAGES_DIR:-/var/cache/clade/images}
RUNSC=${RUNSC:-}
WORK=$(mktemp -d /tmp/clade-democluster.XXXXXX)
BR=cdemo0
NET=10.250.250
PEERS="n1=http://$NET.11:2380,n2=http://$NET.12:2380,n3=http://$NET.13:2380"
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
on() { local k=$1; shift; "$BIN/clade" --host "$WORK/n$k.sock" "$@"; }
declare -A PID

cleanup() {
	set +e
	for k in 1 2 3; do
		[ -n "${PID[$k]:-}" ] || continue
		kill -0 "${PID[$k]}" 2>/dev/null || continue
		for id in $(on "$k" ls -q --node "n$k" 2>/dev/null); do on "$k" rm -f "$id" >/dev/null 2>&1; done
	done
	for k in 1 2 3; do [ -n "${PID[$k]:-}" ] && kill "${PID[$k]}" 2>/dev/null; done
	for k in 1 2 3; do [ -n "${PID[$k]:-}" ] && wait "${PID[$k]}" 2>/dev/null; done
	for k in 1 2 3; do ip link del "cdemo$k" 2>/dev/null; ip netns del "cdemo$k" 2>/dev/null; done
	ip link del "$BR" 2>/dev/null
	grep -o " $WORK[^ ]*" /proc/self/mountinfo | xargs -r -n1 umount -l 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || { echo "demo-cluster makes network namespaces: run it as root" >&2; exit 1; }
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

say "three daemons, one etcd member in each (--cluster embed --cluster-peers), logs in $WORK"
for k in 1 2 3; do
	args=(daemon --cluster embed --cluster-peers "$PEERS" --node "n$k" --listen "$NET.1$k:7070" --token-file "$WORK/token"
		--cluster-listen "$NET.1$k:2379" --cluster-peer-listen "$NET.1$k:2380" --cluster-lease-ttl 2s
		--data-dir "$WORK/n$k" --socket "$WORK/n$k.sock" --images-dir "$IMAGES_DIR" --build-default-image=false
		--network-prefix "cdm$k" --network-range "10.203.$k.0/24" --dns-upstream none --warm-pool 0 --hot-pool 0
		--memory-overcommit 0.1)
	[ -n "$RUNSC" ] && args+=(--runsc "$RUNSC")
	nsenter --net=/run/netns/"cdemo$k" "$BIN/clade" "${args[@]}" >"$WORK/n$k.log" 2>&1 &
	PID[$k]=$!
done
for k in 1 2 3; do
	until on "$k" node ls >/dev/null 2>&1; do
		kill -0 "${PID[$k]}" 2>/dev/null || { cat "$WORK/n$k.log"; exit 1; }
		sleep 0.2
	done
done
on 1 node ls

say "six creates through n1: placement spreads them by memory free after admission"
for i in 1 2 3 4 5 6; do on 1 create --name "web$i" >/dev/null; done
on 1 ls

say "exec through n3 on a sandbox another node holds (proxied)"
on 3 exec web1 -- sh -c 'echo hello from $(hostname)'

say "drain n2: no new placements on it"
on 1 node drain n2
on 1 node ls
on 1 create --name after-drain >/dev/null
on 1 ls --node n2
on 1 node undrain n2

say "SIGKILL n3 (its daemon and etcd member): its running sandboxes become lost, 2 of 3 etcd members serve on"
kill -9 "${PID[3]}"
wait "${PID[3]}" 2>/dev/null || true
until ! on 1 node ls 2>/dev/null | grep -q '^n3'; do sleep 0.5; done
until on 1 ls 2>/dev/null | grep -q ' lost '; do
	on 1 ls -q --node n3 | grep -q . || break # nothing was placed on n3
	sleep 0.5
done
on 1 node ls
on 2 ls
on 2 create --name after-kill >/dev/null && echo "created after-kill with n3 down"

say "n3 back: it finds what the cluster declared lost fenced, and stops it"
args=(daemon --cluster embed --cluster-peers "$PEERS" --node n3 --listen "$NET.13:7070" --token-file "$WORK/token"
	--cluster-listen "$NET.13:2379" --cluster-peer-listen "$NET.13:2380" --cluster-lease-ttl 2s
	--data-dir "$WORK/n3" --socket "$WORK/n3.sock" --images-dir "$IMAGES_DIR" --build-default-image=false
	--network-prefix cdm3 --network-range 10.203.3.0/24 --dns-upstream none --warm-pool 0 --hot-pool 0 --memory-overcommit 0.1)
[ -n "$RUNSC" ] && args+=(--runsc "$RUNSC")
nsenter --net=/run/netns/cdemo3 "$BIN/clade" "${args[@]}" >>"$WORK/n3.log" 2>&1 &
PID[3]=$!
until on 3 node ls >/dev/null 2>&1; do sleep 0.2; done
on 3 node ls
for id in $(on 1 ls | awk '$5 == "lost" { print $1 }'); do
	on 1 rm "$id" >/dev/null && echo "removed lost $id"
done
on 1 ls
say "done; cleaning up"
