"""Datasets: sources (embedded, local files, hub), task formats and teacher tokenization."""
