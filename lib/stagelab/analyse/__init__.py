"""The analysing floor (torch-free): paired speedups, the decision rule, calibration, the verdict.

It imports nothing, so that each module below is loaded only when asked for.
"""
