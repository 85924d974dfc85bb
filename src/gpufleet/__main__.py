"""``python -m gpufleet``: the same as the ``gpufleet`` command."""

import sys

from gpufleet.cli.main import main

sys.exit(main())
