"""Anytime-valid tests: confidence sequences, P99 e-processes and the verdict rule."""
