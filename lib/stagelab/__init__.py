"""stagelab: measured evidence on how logprobs should travel from GPU to host.

Three floors over a ground floor, each importing only from below:

* ground: ``errors`` (the suite's exceptions), ``paths``, ``schema`` (the one tidy row),
  ``device`` (CUDA presence, pinned memory, device labels);
* measure: ``staging``, ``logprobs``, ``native`` (the seed's C++ host path), ``step``,
  ``prompt_logprobs``, ``memory``, ``hardware``, ``bench`` and ``sweep`` (one interleaved,
  fault-isolated sweep for every experiment), ``preflight``;
* analyse (torch-free): ``stats``, ``calibration``, ``analysis``, ``verdict``;
* present and run: ``plots``, ``report``, ``compare``, ``profiles`` and ``params`` (the plan),
  ``rundir`` (run folders and manifests), ``execute`` (papermill), ``context`` (inside a
  notebook), ``evidence`` (kept runs), ``cli``.
"""

__version__ = "0.1.0"
