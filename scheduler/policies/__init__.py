"""Scheduling policies: one module per policy, registered by name in ``registry``."""
