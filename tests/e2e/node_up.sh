#!/usr/bin/env bash
# Bring up a real node for the real-node tier with the project's recipe (tests/e2e/recipe, or GPUFLEET_E2E_RECIPE):
# etcd + kube-apiserver + kube-scheduler (the recipe's cp-up.sh), containerd v2 (CDI on) with the recipe's config and
# images, kube-controller-manager and kubelet. gpufleet's agent and scheduler are NOT started here: the tests start them.
# Every process is recorded ($E2E_DATA/node-pids, $E2E_DATA/pids) and every host change noted, so the recipe's
# node-down.sh stops everything by PID and undoes them, also after an interrupted run. Root only.
#
#   node_up.sh            exit 0 when the node is Ready
#
# Env: GPUFLEET_E2E_BIN (kubelet, kube-controller-manager, kubectl, containerd v2: scripts/build-k8s.sh --print-dir),
#      KUBEBUILDER_ASSETS (kube-apiserver, etcd, kube-scheduler; default GPUFLEET_E2E_BIN),
#      GPUFLEET_E2E_RECIPE (default tests/e2e/recipe), MAX_PODS (kubelet maxPods, default 40),
#      KUBELET_FEATURE_GATES / KCM_EXTRA_ARGS (extra settings for a test that needs them).
set -uo pipefail
HERE_UP=$(cd "$(dirname "$0")" && pwd)
RECIPE=${GPUFLEET_E2E_RECIPE:-$HERE_UP/recipe}
export E2E_BIN=${GPUFLEET_E2E_BIN:?GPUFLEET_E2E_BIN names kubelet, kube-controller-manager, kubectl, containerd}
export K8S_BIN=${KUBEBUILDER_ASSETS:-$E2E_BIN}
HERE=$RECIPE
. "$RECIPE/lib/env.sh"
DATA=$E2E_DATA; LOGS=$E2E_LOGS; NPIDS=$DATA/node-pids; KCFG=$E2E_KUBECONFIG
CTD_SOCK=$DATA/containerd/containerd.sock; NODE=${NODE_NAME:-k8s-e2e-node}; KROOT=/var/lib/kubelet
. "$RECIPE/lib/proc.sh"
[ "$(id -u)" = 0 ] || { echo "node_up.sh: must run as root" >&2; exit 2; }
for b in kubelet kube-controller-manager kubectl containerd containerd-shim-runc-v2 ctr; do
  [ -x "$E2E_BIN/$b" ] || { echo "node_up.sh: $E2E_BIN/$b missing (scripts/build-k8s.sh)" >&2; exit 2; }
done
for port in 7443 10250 10248 10357; do
  ss -Hltn "sport = :$port" | grep -q . && { echo "node_up.sh: port $port in use (another real node up?)" >&2; exit 2; }
done
mkdir -p "$DATA" "$LOGS"
: > "$DATA/preexisting"
for d in $KROOT /var/log/pods /var/log/containers /run/containerd /var/run/cdi /etc/cdi; do
  [ -e "$d" ] && echo "$d" >> "$DATA/preexisting"; done

"$RECIPE/cp-up.sh" >> "$LOGS/node_up.log" 2>&1 || { echo "node_up.sh: control plane failed (see $LOGS)" >&2; exit 1; }

render() { sed -e "s|@E2E_DATA@|$DATA|g" -e "s|@E2E_BIN@|$E2E_BIN|g" "$1" > "$2"; }
mkdir -p "$DATA/containerd" "$DATA/cni" /var/run/cdi
render "$RECIPE/containerd/config.toml.in" "$DATA/containerd/config.toml"
render "$RECIPE/containerd/cni/10-e2e-bridge.conflist.in" "$DATA/cni/10-e2e-bridge.conflist"
render "$RECIPE/kubelet/kubelet-config.yaml.in" "$DATA/kubelet-config.yaml"
sed -i "s/^maxPods: .*/maxPods: ${MAX_PODS:-40}/" "$DATA/kubelet-config.yaml"
if [ -n "${KUBELET_FEATURE_GATES:-}" ]; then
  { echo "featureGates:"; tr ',' '\n' <<< "$KUBELET_FEATURE_GATES" | sed -e 's/^/  /' -e 's/=/: /'; } >> "$DATA/kubelet-config.yaml"
fi
# containerd v2 from the build cache (PATH from lib/env.sh): its shim must be found next to it
start_bg containerd "$E2E_BIN/containerd" --config "$DATA/containerd/config.toml" >> "$LOGS/node_up.log" || exit 1
for _ in $(seq 1 60); do "$E2E_BIN/ctr" -a "$CTD_SOCK" version >/dev/null 2>&1 && break; sleep 0.5; done
IMAGE_TAR=$E2E_IMAGES/busybox-pause310.tar
if [ ! -s "$IMAGE_TAR" ]; then
  mkdir -p "$E2E_IMAGES" && python3 "$RECIPE/images/mkimage.py" "$IMAGE_TAR.tmp" && mv "$IMAGE_TAR.tmp" "$IMAGE_TAR" || exit 1
fi
"$E2E_BIN/ctr" -a "$CTD_SOCK" -n k8s.io images import "$IMAGE_TAR" >> "$LOGS/node_up.log" 2>&1 || exit 1

P=$DATA/pki
# shellcheck disable=SC2086
start_bg kube-controller-manager "$E2E_BIN/kube-controller-manager" --kubeconfig="$KCFG" \
  --authentication-kubeconfig="$KCFG" --authorization-kubeconfig="$KCFG" --bind-address=127.0.0.1 --secure-port=10357 \
  --leader-elect=false --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
  --use-service-account-credentials=false --kube-api-qps=100 --kube-api-burst=200 ${KCM_EXTRA_ARGS:-} >> "$LOGS/node_up.log" || exit 1
: > "$DATA/sysctl.orig"
for s in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
  echo "$s $(cat /proc/sys/$s)" >> "$DATA/sysctl.orig"; done
mkdir -p $KROOT
start_bg kubelet "$E2E_BIN/kubelet" --config="$DATA/kubelet-config.yaml" --kubeconfig="$KCFG" \
  --hostname-override="$NODE" --root-dir=$KROOT --v=2 >> "$LOGS/node_up.log" || exit 1
K() { "$E2E_BIN/kubectl" --kubeconfig "$KCFG" "$@"; }
for _ in $(seq 1 180); do
  [ "$(K get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] \
    && [ -z "$(K get node "$NODE" -o jsonpath='{.spec.taints}' 2>/dev/null)" ] && { echo "node $NODE Ready"; exit 0; }
  sleep 0.5
done
echo "node_up.sh: node $NODE not Ready (see $LOGS/kubelet.log)" >&2
exit 1
