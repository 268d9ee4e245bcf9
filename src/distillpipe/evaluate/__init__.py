"""Evaluation: task metrics, QA post-processing, speed harness, report."""
