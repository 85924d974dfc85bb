#!/usr/bin/env bash
# Build gpufleet's container image from this checkout (see docs/deploy.md).
#
#   scripts/build-image.sh [--tag TAG] [--base IMAGE | --debian-base] [--ca-bundle FILE | --no-ca-bundle] [--save FILE]
#
#   --tag TAG        image name (default ghcr.io/gpufleet/gpufleet:<version in pyproject.toml>)
#   --base IMAGE     the Containerfile's BASE (default: its own, the official slim Python image)
#   --debian-base    build BASE from Debian packages instead (mmdebstrap --variant=minbase + python3, python3-venv;
#                    for machines that reach Debian's mirrors but no container registry); tagged
#                    localhost/gpufleet-base:bookworm
#   --ca-bundle FILE mount FILE at /etc/ssl/certs/ca-certificates.crt for the build's RUN steps only (pip trusts it;
#                    it never lands in the image). Default: the host's /etc/ssl/certs/ca-certificates.crt when it
#                    exists and the builder is buildah or podman (needed behind a TLS-intercepting proxy)
#   --save FILE      also write the image as a docker-archive tarball (for `ctr -n k8s.io images import FILE`,
#                    `podman load`, `docker load`, `kind load image-archive`)
#
# Builder: buildah, else podman, else docker ($BUILDER overrides). Prints the image's size at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
TAG=ghcr.io/gpufleet/gpufleet:$VERSION
BASE=""
DEBIAN_BASE=0
CA=auto
SAVE=""
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) TAG=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --debian-base) DEBIAN_BASE=1; shift ;;
    --ca-bundle) CA=$2; shift 2 ;;
    --no-ca-bundle) CA=""; shift ;;
    --save) SAVE=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -z "$BASE" ] || [ $DEBIAN_BASE = 0 ] || { echo "build-image.sh: --base and --debian-base exclude each other" >&2; exit 2; }

BUILDER=${BUILDER:-$(for b in buildah podman docker; do command -v $b >/dev/null && { echo $b; break; }; done)}
[ -n "$BUILDER" ] || { echo "build-image.sh: needs buildah, podman or docker" >&2; exit 2; }
if [ "$CA" = auto ]; then
  CA=""; [ "$BUILDER" = docker ] || [ ! -s /etc/ssl/certs/ca-certificates.crt ] || CA=/etc/ssl/certs/ca-certificates.crt
fi
[ -z "$CA" ] || [ -s "$CA" ] || { echo "build-image.sh: --ca-bundle $CA: no such file" >&2; exit 2; }
[ -z "$CA" ] || [ "$BUILDER" != docker ] || { echo "build-image.sh: docker build cannot mount a CA bundle (-v); use buildah or podman" >&2; exit 2; }

if [ $DEBIAN_BASE = 1 ]; then
  command -v mmdebstrap >/dev/null || { echo "build-image.sh: --debian-base needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 2; }
  BASE=localhost/gpufleet-base:$SUITE
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  echo "== base image $BASE from Debian $SUITE (mmdebstrap --variant=minbase, python3, python3-venv)"
  # merged-usr hook: no usrmerge package (and the perl it pulls in); no docs, man pages or translations
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "$SUITE" "$tmp/base.tar" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY $SUITE-security main"
  case "$BUILDER" in
    buildah) c=$(buildah from scratch); buildah add --quiet "$c" "$tmp/base.tar" / >/dev/null
             buildah commit --quiet --rm "$c" "$BASE" >/dev/null ;;
    *) "$BUILDER" import "$tmp/base.tar" "$BASE" >/dev/null ;;
  esac
fi

args=(--build-arg "VERSION=$VERSION" -t "$TAG" -f Containerfile)
[ -z "$BASE" ] || args+=(--build-arg "BASE=$BASE")
[ -z "$CA" ] || args+=(-v "$CA:/etc/ssl/certs/ca-certificates.crt:ro")
case "$BUILDER" in
  buildah) cmd=(buildah build --layers "${args[@]}" .) ;;
  *) cmd=("$BUILDER" build "${args[@]}" .) ;;
esac
echo "== ${cmd[*]}"
"${cmd[@]}"

if [ -n "$SAVE" ]; then
  rm -f "$SAVE"
  case "$BUILDER" in
    buildah) buildah push --quiet "$TAG" "docker-archive:$SAVE:$TAG" ;;
    *) "$BUILDER" save -o "$SAVE" "$TAG" ;;
  esac
  echo "== wrote $SAVE ($(du -m "$SAVE" | cut -f1) MiB)"
fi
case "$BUILDER" in
  buildah) size=$(buildah images --noheading --format '{{.Size}}' "$TAG" | head -1) ;;
  *) size="$("$BUILDER" image inspect -f '{{.Size}}' "$TAG") bytes" ;;
esac
echo "== $TAG: $size uncompressed"
