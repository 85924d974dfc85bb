"""``python -m gpufleet``: the same as the ``gpufleet`` command."""

import sys

from gpufleet.cli.main import main

if __name__ == "__main__":  # importing it (the image build's import check walks every module) runs nothing
    sys.exit(main())
