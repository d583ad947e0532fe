"""Integrations with other tools (``celeriac.contrib.pytest``: the pytest plugin)."""
