"""Vector index: table-wide grid, per-superfile fine IVF, SQ8 and 1-bit codes."""
