"""Experiment configs: one ``get_config(variant)`` file per method, shared pieces in ``base``."""
