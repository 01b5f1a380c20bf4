"""Full-text index: tokenizer, per-superfile inverted index, BM25."""
