"""Placeholder, replaced below."""
def register(r):
    pass
