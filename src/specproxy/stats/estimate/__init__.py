"""Estimators: point statistics, bootstrap intervals, rank tests, the length adjustment."""
