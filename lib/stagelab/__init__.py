"""stagelab: measured evidence on how logprobs should travel from GPU to host.

The package is built in floors, one folder each, every module importing only from its own floor
or below (``tests/test_floors.py`` enforces it):

* ``core``: names, files, the tidy row, run folders (standard library only);
* ``measure``: arms, timing loops and probes (torch and the standard library only);
* ``analyse``: statistics, the decision rule, the verdict (no torch);
* ``present``: tables, figures, reports, kept evidence (no torch);
* ``run``: the plan, ``stagelab measure``, the replay, the notebooks' context, the runner, the
  fleet; ``cli`` sits above them all.
"""

__version__ = "0.1.0"
