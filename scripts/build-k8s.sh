#!/usr/bin/env bash
# Build the real Kubernetes components of one release (and containerd v2) from the Go module proxy, into a cache
# outside the checkout, the way out-of-tree schedulers build against k8s.io/kubernetes: a scratch module that requires
# k8s.io/kubernetes vX.Y.Z and replaces every staging module (upstream's `k8s.io/foo => ./staging/src/k8s.io/foo`)
# by its published v0.Y.Z. The real-component test tiers run on what this produces; nothing here is needed at run time.
#
#   scripts/build-k8s.sh [--print-dir] [VERSION] [COMPONENT...]
#     VERSION     a served release, e.g. 1.37.2 (default) or 1.35.4
#     COMPONENT   kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl containerd
#                 containerd-shim-runc-v2 ctr; default: all of them. "control-plane" = kube-apiserver kube-scheduler.
#     --print-dir print the bin folder (after building what is missing) and nothing else on stdout
#
#   Cache: ${GPUFLEET_K8S_CACHE:-~/.cache/gpufleet/k8s}/v<VERSION>/bin: the binaries, an `etcd` link to the etcd on
#   PATH (Debian's etcd-server) when there is one, so the folder also serves as KUBEBUILDER_ASSETS; and a stamp per
#   binary (.<name>.stamp: release, Go version, flags). A second run builds nothing. A binary is written to a
#   temporary name and renamed only when its build succeeded, and the scratch module is made in a temporary folder
#   and renamed whole, so an interrupted run leaves nothing half-written.
#   containerd: CONTAINERD_VERSION (default 2.4.2), built in a scratch module of its own (its dependencies are not
#   Kubernetes'), into the same bin folder.
#
# Exit status: 0 built or up to date; 2 bad input (a release the proxy does not serve, no Go or one too old for the
# release, a cache file this recipe did not write); 1 a build that failed. One line on stderr says why.
set -euo pipefail

PROG=build-k8s.sh
die() { echo "$PROG: $2" >&2; exit "$1"; }
log() { [ "$QUIET" = 1 ] || echo "$PROG: $*"; }

QUIET=0; PRINT_DIR=0
args=()
for a in "$@"; do
  case "$a" in
    --print-dir) PRINT_DIR=1; QUIET=1 ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die 2 "unknown option $a (see --help)" ;;
    *) args+=("$a") ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"

V=1.37.2
if [ $# -gt 0 ] && [[ "$1" =~ ^v?[0-9] ]]; then V=${1#v}; shift; fi
[[ "$V" =~ ^1\.([0-9]+)\.([0-9]+)$ ]] || die 2 "release '$V' is not of the form 1.MINOR.PATCH (e.g. 1.37.2)"
MINOR=${BASH_REMATCH[1]}
ALL=(kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl containerd containerd-shim-runc-v2 ctr)
COMPONENTS=()
for c in "${@:-${ALL[@]}}"; do
  case "$c" in
    control-plane) COMPONENTS+=(kube-apiserver kube-scheduler) ;;
    kube-apiserver|kube-scheduler|kube-controller-manager|kubelet|kubectl|containerd|containerd-shim-runc-v2|ctr) COMPONENTS+=("$c") ;;
    *) die 2 "unknown component '$c' (one of: ${ALL[*]} control-plane)" ;;
  esac
done
CV=${CONTAINERD_VERSION:-2.4.2}
[[ "$CV" =~ ^2\.[0-9]+\.[0-9]+$ ]] || die 2 "CONTAINERD_VERSION '$CV' is not a containerd v2 release (2.MINOR.PATCH)"

CACHE=${GPUFLEET_K8S_CACHE:-$HOME/.cache/gpufleet/k8s}
CACHE=$(realpath -m -- "$CACHE")
REPO=$(cd "$(dirname "$0")/.." && pwd)
case "$CACHE/" in "$REPO"/*) die 2 "GPUFLEET_K8S_CACHE ($CACHE) is inside the checkout; binaries never go there" ;; esac
DIR=$CACHE/v$V
OUT=$DIR/bin
MOD=$DIR/mod
CMOD=$CACHE/containerd-v$CV

command -v go >/dev/null 2>&1 || die 2 "go not found on PATH (Kubernetes $V needs the Go toolchain its go.mod names)"
GOV=$(go env GOVERSION 2>/dev/null) || die 2 "go on PATH does not run"
GOV=${GOV#go}
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=local

ver_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }   # $1 >= $2

# --- the stamp: what a binary was built from; a binary whose stamp matches is up to date ---------------------------
stamp_of() {
  case "$1" in
    containerd|containerd-shim-runc-v2|ctr) echo "containerd v$CV go$GOV tags=no_btrfs,no_devmapper,no_zfs" ;;
    kube-apiserver|kube-scheduler) echo "kubernetes v$V go$GOV tags=providerless" ;;
    *) echo "kubernetes v$V go$GOV tags=providerless,dockerless" ;;
  esac
}
up_to_date() { [ -x "$OUT/$1" ] && [ -f "$OUT/.$1.stamp" ] && [ "$(cat "$OUT/.$1.stamp")" = "$(stamp_of "$1")" ]; }

TODO=()
for c in "${COMPONENTS[@]}"; do
  if up_to_date "$c"; then continue; fi
  if [ -e "$OUT/$c" ] && [ ! -f "$OUT/.$c.stamp" ]; then
    die 2 "$OUT/$c exists but was not written by this recipe (no stamp): remove it, then run again"
  fi
  TODO+=("$c")
done

link_etcd() {  # the bin folder doubles as KUBEBUILDER_ASSETS (kube-apiserver + etcd)
  local e; e=$(command -v etcd 2>/dev/null || true)
  if [ -n "$e" ] && [ -d "$OUT" ] && [ ! -e "$OUT/etcd" ]; then ln -s "$e" "$OUT/etcd"; fi
}

if [ ${#TODO[@]} = 0 ]; then
  link_etcd
  log "v$V: ${COMPONENTS[*]} up to date in $OUT (nothing built)"
  [ "$PRINT_DIR" = 0 ] || echo "$OUT"
  exit 0
fi

TMPS=()
cleanup() { local t; for t in "${TMPS[@]+"${TMPS[@]}"}"; do rm -rf -- "$t"; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM

need_k8s=0; need_ctd=0
for c in "${TODO[@]}"; do case "$c" in containerd*|ctr) need_ctd=1 ;; *) need_k8s=1 ;; esac; done

# --- the scratch module for Kubernetes ------------------------------------------------------------------------------
if [ $need_k8s = 1 ] && { [ ! -f "$MOD/.complete" ] || [ "$(cat "$MOD/.complete")" != "k8s.io/kubernetes v$V" ]; }; then
  log "resolving k8s.io/kubernetes v$V on ${GOPROXY:-$(go env GOPROXY)}"
  info=$(go mod download -json "k8s.io/kubernetes@v$V" 2>&1) || {
    reason=$(printf '%s' "$info" | python3 -c 'import json,sys
try: print(json.load(sys.stdin).get("Error","").splitlines()[0][:200])
except Exception: print("")' 2>/dev/null || true)
    die 2 "release v$V: k8s.io/kubernetes@v$V is not served by the Go module proxy ($(go env GOPROXY))${reason:+: $reason}"; }
  gomod=$(printf '%s' "$info" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  want=$(awk '/^go /{print $2; exit}' "$gomod")
  [ -z "$want" ] || ver_ge "$GOV" "$want" || die 2 "go $GOV is too old for Kubernetes v$V (its go.mod needs go $want)"
  mkdir -p "$DIR"
  tmp=$(mktemp -d "$DIR/.mod.XXXXXX"); TMPS+=("$tmp")
  ( cd "$tmp"
    go mod init local/gpufleet-k8s-build >/dev/null 2>&1
    # every staging module upstream replaces by its ./staging copy -> the published v0.MINOR.PATCH
    for m in $(grep -oE '^\s*k8s\.io/[A-Za-z0-9._-]+ => \./staging/' "$gomod" | awk '{print $1}'); do
      go mod edit -replace="$m=$m@v0.${V#1.}"
    done
    go mod edit -require="k8s.io/kubernetes@v$V"
    # resolve (and download) every module the five commands need, writing go.mod/go.sum once, here
    go list -tags providerless,dockerless -deps $(printf 'k8s.io/kubernetes/cmd/%s ' kube-apiserver kube-scheduler \
      kube-controller-manager kubelet kubectl) >/dev/null ) \
    || die 1 "release v$V: resolving its modules failed (run again; see 'go mod download' above)"
  echo "k8s.io/kubernetes v$V" > "$tmp/.complete"
  rm -rf "$MOD"; mv "$tmp" "$MOD"
fi

# --- the scratch module for containerd ------------------------------------------------------------------------------
if [ $need_ctd = 1 ] && { [ ! -f "$CMOD/.complete" ] || [ "$(cat "$CMOD/.complete")" != "containerd v$CV" ]; }; then
  log "resolving github.com/containerd/containerd/v2 v$CV"
  go mod download -json "github.com/containerd/containerd/v2@v$CV" >/dev/null 2>&1 \
    || die 2 "containerd v$CV: github.com/containerd/containerd/v2@v$CV is not served by the Go module proxy"
  mkdir -p "$CACHE"
  tmp=$(mktemp -d "$CACHE/.containerd.XXXXXX"); TMPS+=("$tmp")
  ( cd "$tmp"
    go mod init local/gpufleet-containerd-build >/dev/null 2>&1
    go get "github.com/containerd/containerd/v2@v$CV" >/dev/null 2>&1
    go list -tags "no_btrfs no_devmapper no_zfs" -deps $(printf 'github.com/containerd/containerd/v2/cmd/%s ' containerd \
      containerd-shim-runc-v2 ctr) >/dev/null ) \
    || die 1 "containerd v$CV: resolving its modules failed"
  echo "containerd v$CV" > "$tmp/.complete"
  rm -rf "$CMOD"; mv "$tmp" "$CMOD"
fi

# --- build ------------------------------------------------------------------------------------------------------------
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
LD="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LD="$LD -X $p.gitVersion=v$V -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean -X $p.buildDate=$BUILD_DATE"
done
t0=$(date +%s)
mkdir -p "$OUT"
for c in "${TODO[@]}"; do
  s=$(date +%s)
  tmpbin=$(mktemp "$OUT/.$c.XXXXXX"); TMPS+=("$tmpbin")
  case "$c" in
    kube-apiserver|kube-scheduler)
      (cd "$MOD" && go build -trimpath -tags providerless -ldflags "$LD" -o "$tmpbin" "k8s.io/kubernetes/cmd/$c") ;;
    kubelet|kube-controller-manager|kubectl)
      (cd "$MOD" && go build -trimpath -tags providerless,dockerless -ldflags "$LD" -o "$tmpbin" "k8s.io/kubernetes/cmd/$c") ;;
    containerd|containerd-shim-runc-v2|ctr)
      (cd "$CMOD" && go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
        -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=v$CV" \
        -o "$tmpbin" "github.com/containerd/containerd/v2/cmd/$c") ;;
  esac || die 1 "building $c of v$V failed (see the compiler output above)"
  chmod 755 "$tmpbin"
  rm -f "$OUT/.$c.stamp"
  mv -f "$tmpbin" "$OUT/$c"
  stamp_of "$c" > "$OUT/.$c.stamp"
  log "built $c in $(( $(date +%s) - s )) s"
done
link_etcd
log "v$V: built ${TODO[*]} in $(( $(date +%s) - t0 )) s -> $OUT"
[ "$PRINT_DIR" = 0 ] || echo "$OUT"
