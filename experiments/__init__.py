"""Experiments: specs, runners and analysis, joined by a run directory."""
