"""The presenting floor (torch-free): the machine in words, tables, figures, reports, kept evidence.

It imports nothing, so that each module below is loaded only when asked for.
"""
