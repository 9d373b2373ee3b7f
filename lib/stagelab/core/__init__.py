"""The ground floor: names, files, the row schema and run folders, with the standard library only.

It imports nothing, so that each module below is loaded only when asked for.
"""
