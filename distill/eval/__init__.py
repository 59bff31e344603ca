"""Evaluation: metrics, TREC run files, significance, fidelity and evaluation reports."""
