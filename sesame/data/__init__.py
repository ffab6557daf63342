"""Data: raw text corpora, token shards, and labeled files."""
