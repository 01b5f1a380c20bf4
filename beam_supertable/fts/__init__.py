"""Full-text index: tokenizer, per-superfile inverted index, BM25.

Index math on bytes and arrays: it imports nothing of the package outside
this folder and does no I/O; the storage layer (``format/``) reads and writes
its sections.
"""
