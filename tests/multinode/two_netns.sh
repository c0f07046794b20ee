#!/usr/bin/env bash
# Two nodes that are two network namespaces (issue 53): each with its own veth interface and address, joined by
# a veth pair, so the rendezvous, gloo's pairs (which listen on the interface that reaches node 0) and the
# pipeline's transfers cross a real link between separate network stacks, as between two machines. Checks that:
#   - `logits` with --tp 2, --pp 2 and --pp 2 --tp 2 over the two namespaces equals the same split in one process
#     (and, without tensor parallelism, one process without stages) bit for bit;
#   - greedy `generate` tokens with --pp 2 equal one process's;
#   - a node told an address no interface of its namespace reaches fails within --dist-timeout, naming it.
# Needs network namespaces: root, or an unprivileged user namespace (the script re-runs itself inside one);
# exits 77 (skipped) with the reason when the kernel allows neither.
# Usage: two_netns.sh MEGACTX_BINARY
set -euo pipefail
bin=$(readlink -f "$1")
if [ "$(id -u)" -ne 0 ] && [ -z "${MEGACTX_NETNS_INNER:-}" ]; then
    if unshare --user --map-root-user --mount --net true 2>/dev/null; then
        MEGACTX_NETNS_INNER=1 exec unshare --user --map-root-user --mount --net bash "$0" "$@"
    fi
    echo "two_netns: skipped: not root and no unprivileged user namespaces (kernel.unprivileged_userns_clone)"
    exit 77
fi
command -v ip >/dev/null || { echo "two_netns: skipped: no 'ip' (iproute2)"; exit 77; }
if [ -n "${MEGACTX_NETNS_INNER:-}" ]; then
    # a user namespace: ip netns keeps its mounts under /run/netns, private to this mount namespace
    mount -t tmpfs none /run 2>/dev/null || { echo "two_netns: skipped: cannot mount /run here"; exit 77; }
fi
tag=mx$$
a=${tag}a b=${tag}b work=$(mktemp -d)
cleanup() {
    ip netns pids "$a" 2>/dev/null | xargs -r kill 2>/dev/null || true
    ip netns pids "$b" 2>/dev/null | xargs -r kill 2>/dev/null || true
    ip netns del "$a" 2>/dev/null || true
    ip netns del "$b" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
if ! ip netns add "$a" 2>"$work/err"; then
    echo "two_netns: skipped: cannot create a network namespace ($(cat "$work/err"))"
    exit 77
fi
ip netns add "$b"
ip link add "${tag}x" type veth peer name "${tag}y"
ip link set "${tag}x" netns "$a"
ip link set "${tag}y" netns "$b"
ip -n "$a" addr add 10.213.7.1/24 dev "${tag}x"
ip -n "$b" addr add 10.213.7.2/24 dev "${tag}y"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "${tag}x" up
ip -n "$b" link set "${tag}y" up

"$bin" gen-model --preset tiny --seed 0 --out "$work/model" >/dev/null
fail=0
port=29700
# the same command on two nodes, node k in namespace k; node 0's stdout in $work/out, both stderrs kept
two_nodes() {
    port=$((port + 1))
    local addr="--nnodes 2 --dist-init-addr 10.213.7.1:$port --dist-timeout 30"
    ip netns exec "$b" "$bin" "$@" $addr --node-rank 1 >"$work/node1.out" 2>"$work/node1.err" &
    local follower=$!
    local rc=0
    ip netns exec "$a" "$bin" "$@" $addr --node-rank 0 >"$work/out" 2>"$work/node0.err" || rc=$?
    wait "$follower" || rc=$((rc + 100))
    if [ "$rc" -ne 0 ]; then
        echo "FAIL: $* on two namespaces exited $rc"
        cat "$work/node0.err" "$work/node1.err"
        fail=1
    fi
    return 0
}
toks="--tokens 3,1,4,1,5,9,2,6,5,3,5,8 --chunk 5"
"$bin" logits --model "$work/model" $toks --out "$work/one.npy" 2>/dev/null
"$bin" logits --model "$work/model" $toks --tp 2 --out "$work/tp2.npy" 2>/dev/null
for split in "--tp 2:tp2" "--pp 2:one" "--pp 2 --tp 2:tp2"; do
    flags=${split%%:*} want=${split##*:}
    two_nodes logits --model "$work/model" $toks $flags --out "$work/nodes.npy"
    if cmp -s "$work/nodes.npy" "$work/$want.npy"; then
        echo "ok: logits $flags on two namespaces = $want in one process, bit for bit"
    else
        echo "FAIL: logits $flags on two namespaces differ from $want in one process"
        fail=1
    fi
done
gen="generate --model $work/model --tokens 1,2,3,4,5 --max-new-tokens 16 --ignore-eos"
"$bin" $gen >"$work/gen-one" 2>/dev/null
two_nodes $gen --pp 2
if cmp -s "$work/out" "$work/gen-one"; then
    echo "ok: generate --pp 2 on two namespaces = one process ($(tr '\n' ' ' <"$work/out"))"
else
    echo "FAIL: generate --pp 2 on two namespaces: '$(cat "$work/out")' against '$(cat "$work/gen-one")'"
    fail=1
fi
# node 1 told an address that nothing in its namespace reaches: an error naming it within --dist-timeout
set +e
start=$SECONDS
ip netns exec "$b" timeout 60 "$bin" $gen --pp 2 --nnodes 2 --node-rank 1 --dist-init-addr 10.213.9.1:$((port + 1)) \
    --dist-timeout 2 >/dev/null 2>"$work/unreach.err"
rc=$?
set -e
if [ "$rc" -eq 1 ] && grep -q "megactx: error: " "$work/unreach.err" && [ $((SECONDS - start)) -lt 30 ]; then
    echo "ok: an unreachable node 0 is an error after $((SECONDS - start)) s: $(grep -m1 'error' "$work/unreach.err")"
else
    echo "FAIL: an unreachable node 0 (exit $rc after $((SECONDS - start)) s): $(cat "$work/unreach.err")"
    fail=1
fi
exit $fail
