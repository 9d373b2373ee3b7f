"""The measuring floor: the timing loops, arms and probes, importable with torch and the standard
library alone (a node, a Ray worker, a locked-down server).

It imports nothing, so that each module below is loaded only when asked for.
"""
