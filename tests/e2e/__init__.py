"""The real-n8n tier (marker ``n8n``).

A package so that its ``conftest.py`` is imported as ``e2e.conftest`` and
never takes the name ``conftest`` from ``tests/conftest.py``, which the test
modules import from (``free_port``, the store servers).
"""
