"""``python -m stagelab`` is the ``stagelab`` command."""

import sys

from stagelab.cli import console

sys.exit(console())
