#!/usr/bin/env bash
# Install gpufleet with its test extras, then run the static checks and the whole test suite.
#
#   bash scripts/test.sh [PYTEST ARGS...]
#   GPUFLEET_APISERVER_TIER=1.37.2 bash scripts/test.sh    # also the apiserver tier, on a real kube-apiserver and
#                                                          # kube-scheduler of that release (built by scripts/build-k8s.sh
#                                                          # from the Go module proxy: ~15 min cold, cached after), with
#                                                          # Debian's etcd and Prometheus and prometheus-adapter
# With GPUFLEET_APISERVER_TIER set, a failed build fails the run, and so does any apiserver-tier test that would skip
# for want of its binaries: nothing is skipped silently. CI (.ci/run) runs it this way.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e '.[test]'
python3 -m ruff check src tests bench
python3 -m mypy
if [ -n "${GPUFLEET_APISERVER_TIER:-}" ]; then
  v=$GPUFLEET_APISERVER_TIER; [ "$v" != 1 ] || v=1.37.2
  t0=$(date +%s)
  need=(); command -v etcd >/dev/null 2>&1 || need+=(etcd-server); command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
  if [ ${#need[@]} -gt 0 ]; then
    echo "test.sh: installing Debian's ${need[*]} for the apiserver tier"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } \
      || { echo "test.sh: FAILED to install ${need[*]} for the apiserver tier" >&2; exit 1; }
  fi
  if ! assets=$(bash scripts/build-k8s.sh --print-dir "$v" kube-apiserver kube-scheduler kubectl); then
    echo "test.sh: FAILED to build kube-apiserver/kube-scheduler/kubectl v$v for the apiserver tier (scripts/build-k8s.sh above)" >&2
    exit 1
  fi
  if ! adapter=$(bash scripts/build-prometheus-adapter.sh | tail -1) || [ ! -x "$adapter" ]; then
    echo "test.sh: FAILED to build prometheus-adapter for the apiserver tier (scripts/build-prometheus-adapter.sh above)" >&2
    exit 1
  fi
  echo "test.sh: apiserver tier on Kubernetes v$v ($assets; prometheus-adapter $adapter), ready in $(( $(date +%s) - t0 )) s"
  export KUBEBUILDER_ASSETS=$assets KUBECTL=$assets/kubectl GPUFLEET_PROMETHEUS_ADAPTER=$adapter GPUFLEET_REQUIRE_APISERVER=1
fi
python3 -m pytest "$@"
