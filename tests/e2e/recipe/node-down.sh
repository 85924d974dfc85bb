#!/usr/bin/env bash
# Tear down a real node brought up by tests/e2e/node_up.sh (or left by an interrupted run): stop every process recorded
# in $E2E_DATA/node-pids by PID (after checking /proc/PID/exe, never by name), remove what kubelet left in our
# containerd, unmount, and undo every host change: kubelet's sysctls restored, placeholder device nodes and CDI specs
# removed, /var/lib/kubelet, /var/log/{pods,containers}, /run/containerd removed when they did not exist before,
# kubepods cgroups and the CNI bridge removed; then the control plane (cp-down.sh --wipe). Root only. Idempotent.
#
#   node-down.sh
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib/env.sh"
DATA=$E2E_DATA; LOGS=$E2E_LOGS; NPIDS=$DATA/node-pids; KCFG=$E2E_KUBECONFIG
CTD_SOCK=$DATA/containerd/containerd.sock; KROOT=/var/lib/kubelet
[ "$(id -u)" = 0 ] || { echo "node-down.sh: must run as root" >&2; exit 2; }
mkdir -p "$LOGS"
. "$HERE/lib/proc.sh"
K() { "$E2E_BIN/kubectl" --kubeconfig "$KCFG" "$@"; }

if [ -f "$NPIDS" ] && grep -q '^kubelet ' "$NPIDS" && [ -s "$KCFG" ] && [ -x "$E2E_BIN/kubectl" ]; then
  K delete pods --all -A --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1 \
    || echo "      (pod deletion incomplete; containers are removed below)"
fi
# everything but containerd first (tests record their own processes here too: agents, schedulers, Prometheus...)
if [ -f "$NPIDS" ]; then
  while read -r n p e; do
    [ "$n" = containerd ] || stop_pid "$n" "$p" "$e" 15
  done < <(tac "$NPIDS")
fi
if [ -S "$CTD_SOCK" ]; then   # whatever kubelet left: kill and remove every task/container in k8s.io
  for c in $(ctr -a "$CTD_SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -a "$CTD_SOCK" -n k8s.io tasks kill -s SIGKILL "$c" >/dev/null 2>&1; done
  sleep 1
  for c in $(ctr -a "$CTD_SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -a "$CTD_SOCK" -n k8s.io tasks rm -f "$c" >/dev/null 2>&1; done
  for c in $(ctr -a "$CTD_SOCK" -n k8s.io containers ls -q 2>/dev/null); do
    ctr -a "$CTD_SOCK" -n k8s.io containers rm "$c" >/dev/null 2>&1; done
fi
stop_named containerd 20
for p in /proc/[0-9]*; do   # shims of OUR containerd only (their command line names our socket), by PID
  if { tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null | grep -q -- "containerd-shim-runc-v2 .*-address $CTD_SOCK"; then
    echo "      leftover shim pid ${p#/proc/}: SIGKILL"; kill -KILL "${p#/proc/}" 2>/dev/null; fi
done
for m in $(awk '{print $2}' /proc/self/mounts | grep -E "^($DATA|$KROOT)(/|$)" | sort -r); do umount -l "$m" 2>/dev/null; done
for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do [ -d "$h" ] && find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null; done
ip link show e2ecni0 >/dev/null 2>&1 && ip link del e2ecni0
for f in "$DATA/created-files" "$DATA/created-devnodes"; do [ -f "$f" ] && xargs -r rm -f < "$f"; done
if [ -f "$DATA/sysctl.orig" ]; then
  while read -r k v; do [ "$(cat "/proc/sys/$k")" = "$v" ] || echo "$v" > "/proc/sys/$k"; done < "$DATA/sysctl.orig"
fi
if [ -f "$DATA/preexisting" ]; then
  for d in $KROOT /var/log/pods /var/log/containers /run/containerd /var/run/cdi /etc/cdi; do
    grep -qx "$d" "$DATA/preexisting" || rm -rf "$d"; done
fi
rm -f "$NPIDS"
"$HERE/cp-down.sh" --wipe 2>&1 | sed 's/^/      /'
exit 0
