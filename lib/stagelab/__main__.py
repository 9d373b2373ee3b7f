"""``python -m stagelab`` is the ``stagelab`` command."""

import sys

from stagelab.cli import main

sys.exit(main())
