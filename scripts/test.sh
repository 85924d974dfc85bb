#!/usr/bin/env bash
# Install gpufleet with its test extras, then run the static checks and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e '.[test]'
python3 -m ruff check src tests bench
python3 -m mypy
python3 -m pytest "$@"
