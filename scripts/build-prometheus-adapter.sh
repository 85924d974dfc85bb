#!/usr/bin/env bash
# Build prometheus-adapter (kubernetes-sigs) from the Go module proxy for gpufleet's autoscaling test tier
# (see docs/autoscaling.md). Nothing lands in the checkout: the binary goes to
#   ${GPUFLEET_CACHE:-~/.cache/gpufleet}/prometheus-adapter/<version>/bin/adapter
# and the script prints that path as its last line.
#
#   scripts/build-prometheus-adapter.sh [--version vX.Y.Z] [--print-path]
#
#   --version V    module version (default v0.12.0, the newest release the proxy serves)
#   --print-path   print where the binary is (or would be) and exit 0 without building
#
# Idempotent: an existing binary that reports the asked version is kept. The build runs in a temporary GOBIN
# and moves the binary into place only when it built and runs, so an interrupted run leaves nothing
# half-written. Needs Go (>= 1.22) and the module proxy (GOPROXY, default proxy.golang.org); about 5 minutes and
# 2 GiB of memory on 2 cores. Exit 2 for a bad argument or a missing Go, 1 when the build fails.
set -euo pipefail

VERSION=v0.12.0
PRINT=0
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || { echo "build-prometheus-adapter.sh: --version needs a value (e.g. v0.12.0)" >&2; exit 2; }
               VERSION=$2; shift 2 ;;
    --print-path) PRINT=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build-prometheus-adapter.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "build-prometheus-adapter.sh: --version must look like v0.12.0, got '$VERSION'" >&2; exit 2; }

DEST=${GPUFLEET_CACHE:-$HOME/.cache/gpufleet}/prometheus-adapter/$VERSION/bin
BIN=$DEST/adapter
if [ $PRINT = 1 ]; then echo "$BIN"; exit 0; fi
if [ -x "$BIN" ] && [ -s "$DEST/.version" ] && [ "$(cat "$DEST/.version")" = "$VERSION" ]; then
  echo "$BIN"; exit 0
fi
command -v go >/dev/null || { echo "build-prometheus-adapter.sh: needs Go >= 1.22 on PATH" >&2; exit 2; }

mkdir -p "$DEST"
tmp=$(mktemp -d "$DEST/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# `go install pkg@version` asks the proxy for the module's version list (a deprecation check), which this proxy
# refuses for prometheus-adapter (403), so: download the exact version, build its cmd/adapter from the module cache
# (read-only, never copied anywhere), its go.sum pinning every dependency.
echo "== go mod download sigs.k8s.io/prometheus-adapter@$VERSION (GOPROXY=$(go env GOPROXY))" >&2
if ! dir=$(cd "$tmp" && go mod download -json "sigs.k8s.io/prometheus-adapter@$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'); then
  echo "build-prometheus-adapter.sh: go mod download sigs.k8s.io/prometheus-adapter@$VERSION failed (output above)" >&2
  exit 1
fi
echo "== go build ./cmd/adapter in $dir" >&2
# -trimpath: no build paths in the binary; CGO off: a static binary like the project's release images
if ! (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "$tmp/adapter" ./cmd/adapter) >&2; then
  echo "build-prometheus-adapter.sh: go build of prometheus-adapter $VERSION failed (output above)" >&2
  exit 1
fi
# its --help exits 2 (pflag): check that it runs and knows its own flags instead
help=$("$tmp/adapter" --help 2>&1 || true)
[[ $help == *--prometheus-url* ]] || { echo "build-prometheus-adapter.sh: the built adapter does not run (--help)" >&2; exit 1; }
mv -f "$tmp/adapter" "$BIN"
printf '%s\n' "$VERSION" > "$tmp/version" && mv -f "$tmp/version" "$DEST/.version"
echo "$BIN"
