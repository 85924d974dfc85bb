#!/usr/bin/env bash
# The prepared check of the node agent's real NVML path on a GPU machine (issue 40; docs/agent.md).
#
# Installs gpufleet (pip, from this checkout, into a folder of its own) and those of its
# dependencies the check needs that this Python lacks or has too old, then runs
# bench/device_check.py against the real NVML backend and nvidia-smi: about a minute.
# Nothing here changes a device setting: nvidia-smi is only queried.
#
#   bash bench/device_check.sh [device_check.py options, e.g. --gpu 0 --load ptx]
#   bash bench/device_check.sh --download-wheels DIR   # where pip reaches an index: wheels of the
#                                                      # check's dependencies, to carry to a machine without one
#
# Environment: PYTHON (default python3, >= 3.11); OUT (results: device_check.json, the table, logs);
# DEVICE_CHECK_WHEELS (wheels to install from without an index; default ./.whl when present);
# DEVICE_CHECK_DIR (work folder, default /tmp/gpufleet-device-check);
# DEVICE_CHECK_INSTALL_TORCH=1 (pip install torch when missing, for the matmul load; without it the
# load is PyTorch when installed, else a PTX loop through the driver's libcuda, which needs no download).
# Exit status: the check's (0 all passed or skipped, 1 a check failed), 2 for bad usage.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
PY=${PYTHON:-python3}
PIP=("$PY" -m pip --disable-pip-version-check --no-input)
say() { echo "device_check.sh: $*"; }

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  say "$PY is not Python >= 3.11 (set PYTHON)" >&2
  exit 2
fi

if [[ ${1:-} == --download-wheels ]]; then
  dir=${2:?usage: device_check.sh --download-wheels DIR}
  mapfile -t reqs < <("$PY" bench/device_check.py --print-check-deps)
  # the GPU machines' Python is 3.12 on x86-64 (docs/agent.md); DEVICE_CHECK_PY_VERSION for another
  "${PIP[@]}" download -q --no-deps --only-binary=:all: --implementation cp --python-version "${DEVICE_CHECK_PY_VERSION:-3.12}" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir" "${reqs[@]}" || exit 1
  say "wheels for ${reqs[*]} in $dir ($(du -sh "$dir" | cut -f1))"
  exit 0
fi

WORK=${DEVICE_CHECK_DIR:-/tmp/gpufleet-device-check}
SITE=$WORK/site
rm -rf "$SITE" && mkdir -p "$SITE" || exit 1
if [[ -n ${OUT:-} ]]; then mkdir -p "$OUT" && LOG=$OUT/install.log; else LOG=$WORK/install.log; fi
: >"$LOG"
WHEELS=${DEVICE_CHECK_WHEELS:-}
[[ -z $WHEELS && -d $ROOT/.whl ]] && WHEELS=$ROOT/.whl

# 1. gpufleet itself, built with the setuptools already installed (no download), from a copy so that the
#    build leaves nothing in the checkout
rm -rf "$WORK/build" && mkdir -p "$WORK/build" && cp -r "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/src" "$WORK/build/"
if "${PIP[@]}" install -q --no-deps --no-build-isolation --no-index --target "$SITE" "$WORK/build" >>"$LOG" 2>&1; then
  say "installed gpufleet from $ROOT into $SITE"
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
else
  say "pip could not build gpufleet here (no setuptools >= 61? see $LOG); running it from $ROOT/src"
  export PYTHONPATH=$SITE:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
fi

# 2. what the check needs and this Python lacks: from the wheels when given, else from the package index
mapfile -t MISSING < <("$PY" bench/device_check.py --print-missing-deps 2>>"$LOG")
for req in "${MISSING[@]}"; do
  [[ -z $req ]] && continue
  if [[ -n $WHEELS ]]; then src=(--no-index --find-links "$WHEELS" --no-deps); else src=(--timeout 15 --retries 1); fi
  if "${PIP[@]}" install -q --upgrade --target "$SITE" "${src[@]}" "$req" >>"$LOG" 2>&1; then
    say "installed $req"
  else
    say "could not install $req (${WHEELS:+no wheel for it in $WHEELS}${WHEELS:-no package index answered}; see $LOG): the parts that need it will fail"
  fi
done

# 3. PyTorch for the matmul load, only when asked (it is a large download)
if [[ ${DEVICE_CHECK_INSTALL_TORCH:-0} == 1 ]] && ! "$PY" -c 'import torch' 2>/dev/null; then
  if timeout "${DEVICE_CHECK_TORCH_TIMEOUT_S:-300}" "${PIP[@]}" install -q --target "$SITE" --timeout 15 --retries 1 torch >>"$LOG" 2>&1; then
    say "installed torch"
  else
    say "could not install torch (see $LOG): the load falls back to the PTX loop"
  fi
fi

export PYTHONUNBUFFERED=1
exec "$PY" bench/device_check.py "$@"
