"""The run floor: the plan and its checks, the node's command (``stagelab measure``), the replay,
the notebooks' context, the papermill runner and the fleet.

It imports nothing, so that each module below is loaded only when asked for.
"""
