#!/usr/bin/env bash
# Install gpufleet with its test extras, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e '.[test]'
python3 -m pytest "$@"
