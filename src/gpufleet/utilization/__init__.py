"""Utilisation control: find GPUs that are allocated but idle, reclaim them under a policy, right-size requests."""
