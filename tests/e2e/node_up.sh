#!/usr/bin/env bash
# Bring up a real node for the e2e tier with the shared real-node recipe (GPUFLEET_E2E_RECIPE, e.g. shared/e2e):
# etcd + kube-apiserver + kube-scheduler (the recipe's cp-up.sh), containerd with the recipe's config and images,
# kube-controller-manager and kubelet. gpufleet's agent and scheduler are NOT started here: the tests start them.
# Every process is recorded in the recipe's bookkeeping ($E2E_DATA/node-pids, $E2E_DATA/pids), so the recipe's
# `run-e2e.sh --cleanup` stops everything by PID and undoes every host change. Root only.
#
#   node_up.sh            exit 0 when the node is Ready
#
# Env: GPUFLEET_E2E_RECIPE (required), GPUFLEET_E2E_BIN (kubelet, kube-controller-manager, kubectl),
#      KUBEBUILDER_ASSETS (kube-apiserver, etcd, kube-scheduler), MAX_PODS (kubelet maxPods, default 40).
set -uo pipefail
RECIPE=${GPUFLEET_E2E_RECIPE:?GPUFLEET_E2E_RECIPE names the real-node recipe directory}
export E2E_BIN=${GPUFLEET_E2E_BIN:?GPUFLEET_E2E_BIN names kubelet, kube-controller-manager, kubectl}
export K8S_BIN=${KUBEBUILDER_ASSETS:?KUBEBUILDER_ASSETS names kube-apiserver, etcd, kube-scheduler}
HERE=$RECIPE
. "$RECIPE/lib/env.sh"
DATA=$E2E_DATA; LOGS=$E2E_LOGS; NPIDS=$DATA/node-pids; KCFG=$E2E_KUBECONFIG
CTD_SOCK=$DATA/containerd/containerd.sock; NODE=${NODE_NAME:-k8s-e2e-node}; KROOT=/var/lib/kubelet
. "$RECIPE/lib/proc.sh"
[ "$(id -u)" = 0 ] || { echo "node_up.sh: must run as root" >&2; exit 2; }
for port in 7443 10250 10248 10357; do
  ss -Hltn "sport = :$port" | grep -q . && { echo "node_up.sh: port $port in use (another real node up?)" >&2; exit 2; }
done
mkdir -p "$DATA" "$LOGS"
: > "$DATA/preexisting"
for d in $KROOT /var/log/pods /var/log/containers /run/containerd; do [ -e "$d" ] && echo "$d" >> "$DATA/preexisting"; done

"$RECIPE/cp-up.sh" >> "$LOGS/node_up.log" 2>&1 || { echo "node_up.sh: control plane failed (see $LOGS)" >&2; exit 1; }

render() { sed -e "s|@E2E_DATA@|$DATA|g" "$1" > "$2"; }
mkdir -p "$DATA/containerd" "$DATA/cni"
render "$RECIPE/containerd/config.toml.in" "$DATA/containerd/config.toml"
render "$RECIPE/containerd/cni/10-e2e-bridge.conflist.in" "$DATA/cni/10-e2e-bridge.conflist"
render "$RECIPE/kubelet/kubelet-config.yaml.in" "$DATA/kubelet-config.yaml"
sed -i "s/^maxPods: .*/maxPods: ${MAX_PODS:-40}/" "$DATA/kubelet-config.yaml"
start_bg containerd containerd --config "$DATA/containerd/config.toml" >> "$LOGS/node_up.log" || exit 1
for _ in $(seq 1 60); do ctr -a "$CTD_SOCK" version >/dev/null 2>&1 && break; sleep 0.5; done
IMAGE_TAR=$E2E_IMAGES/busybox-pause.tar
[ -s "$IMAGE_TAR" ] || { mkdir -p "$E2E_IMAGES" && python3 "$RECIPE/images/mkimage.py" "$IMAGE_TAR"; } || exit 1
ctr -a "$CTD_SOCK" -n k8s.io images import "$IMAGE_TAR" >> "$LOGS/node_up.log" 2>&1 || exit 1

P=$DATA/pki
start_bg kube-controller-manager "$E2E_BIN/kube-controller-manager" --kubeconfig="$KCFG" \
  --authentication-kubeconfig="$KCFG" --authorization-kubeconfig="$KCFG" --bind-address=127.0.0.1 --secure-port=10357 \
  --leader-elect=false --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
  --use-service-account-credentials=false --kube-api-qps=100 --kube-api-burst=200 >> "$LOGS/node_up.log" || exit 1
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
