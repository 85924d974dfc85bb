# Where the real-node recipe finds and keeps things. Sourced by cp-up.sh, cp-down.sh, node-down.sh and
# tests/e2e/node_up.sh with HERE set to the recipe's folder. Every location can be overridden from the environment.
#   K8S_VERSION   the Kubernetes release (default 1.37.2); its binaries come from scripts/build-k8s.sh
#   K8S_BIN       kube-apiserver, kube-scheduler, etcd         default ${GPUFLEET_K8S_CACHE:-~/.cache/gpufleet/k8s}/v$K8S_VERSION/bin
#   E2E_BIN       kubelet, kube-controller-manager, kubectl,   default the same folder
#                 containerd, containerd-shim-runc-v2, ctr
#   E2E_IMAGES    busybox-pause.tar (images/mkimage.py)        default ~/.cache/gpufleet/e2e-images
#   E2E_DATA, E2E_LOGS  run state (etcd, pki, containerd, pids) and logs   default ${TMPDIR:-/tmp}/k8s-e2e-{data,logs}
#   E2E_KUBECONFIG      admin kubeconfig written by cp-up.sh               default $E2E_DATA/kubeconfig
: "${HERE:?lib/env.sh needs HERE}"
_e2e_abs() { realpath -m -- "$1"; }
_e2e_tmp=${TMPDIR:-/tmp}
K8S_VERSION=${K8S_VERSION:-1.37.2}
_e2e_cache=${GPUFLEET_K8S_CACHE:-$HOME/.cache/gpufleet/k8s}
K8S_BIN=$(_e2e_abs "${K8S_BIN:-$_e2e_cache/v$K8S_VERSION/bin}")
E2E_BIN=$(_e2e_abs "${E2E_BIN:-$K8S_BIN}")
E2E_IMAGES=$(_e2e_abs "${E2E_IMAGES:-$HOME/.cache/gpufleet/e2e-images}")
E2E_DATA=$(_e2e_abs "${E2E_DATA:-$_e2e_tmp/k8s-e2e-data}")
E2E_LOGS=$(_e2e_abs "${E2E_LOGS:-$_e2e_tmp/k8s-e2e-logs}")
E2E_KUBECONFIG=$(_e2e_abs "${E2E_KUBECONFIG:-$E2E_DATA/kubeconfig}")
# containerd v2 and its shim come from the same cache as kubelet (Debian's containerd 1.6 has no CDI)
case ":$PATH:" in *":$E2E_BIN:"*) ;; *) PATH=$E2E_BIN:$PATH ;; esac
export K8S_VERSION K8S_BIN E2E_BIN E2E_IMAGES E2E_DATA E2E_LOGS E2E_KUBECONFIG PATH
