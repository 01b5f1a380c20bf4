"""Vector index: table-wide grid, per-superfile fine IVF, SQ8 and 1-bit codes.

Index math on numpy arrays: it imports nothing of the package outside this folder
and does no I/O; the storage layer (``format/``) reads and writes its bytes.
"""
