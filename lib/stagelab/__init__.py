"""stagelab: measured evidence on how logprobs should travel from GPU to host.

One concern per module: ``staging`` (host staging arms), ``logprobs`` and ``step`` (per-step
logprobs and the step's pipelines), ``prompt_logprobs`` (chunked prompt logprobs), ``bench`` and
``stats`` (timing and statistics), ``memory``, ``hardware`` (machine snapshot), ``schema`` (the tidy
row every measurement uses), ``runs`` and ``report`` (papermill run folders and their HTML),
``verdict`` (port or close), ``shapes`` (real model shapes).
"""

__version__ = "0.1.0"
