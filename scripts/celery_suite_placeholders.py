"""Placeholders for the names Celery's integration suite imports at module level that
celeriac does not have yet, so that every test module collects and each test that uses
one fails on its own, counted under its cause (pytest plugin, loaded only by
``scripts/celery_suite.py --placeholders``; never a port's fix: each name here is a
missing feature, listed in docs/migrating.md).

A placeholder is set only while the real name is missing, so the list shrinks by itself
as celeriac gains them; the run's header says which were set.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

PLACED: list[str] = []


def _place() -> None:
    import celeriac.app
    import celeriac.canvas
    import celeriac.worker

    # Task options the suite's tasks pass (@shared_task(typing=False), pydantic=True):
    # refused by the app, so that no app could be made. Dropped here.
    app_module: Any = celeriac.app
    unknown = {"typing", "pydantic"} - app_module.TASK_OPTIONS
    if unknown:
        task_options = app_module._task_options

        def without_unknown(name: str, options: dict[str, Any]) -> Any:
            for option in unknown:
                options.pop(option, None)
            return task_options(name, options)

        app_module.TASK_OPTIONS = app_module.TASK_OPTIONS | unknown
        app_module._task_options = without_unknown
        PLACED.extend(f"task option {option}= (ignored)" for option in sorted(unknown))

    if not hasattr(celeriac.canvas, "StampingVisitor"):
        class StampingVisitor:
            """Placeholder: celeriac.canvas has no stamping yet."""

        celeriac.canvas.StampingVisitor = StampingVisitor  # type: ignore[attr-defined]
        PLACED.append("celeriac.canvas.StampingVisitor")
    try:
        import celeriac.worker.state
    except ImportError:
        state = types.ModuleType("celeriac.worker.state")
        state.revoked_stamps = set()  # type: ignore[attr-defined]
        sys.modules["celeriac.worker.state"] = state
        celeriac.worker.state = state  # type: ignore[attr-defined]
        PLACED.append("celeriac.worker.state (revoked_stamps)")


_place()


def pytest_report_header(config: pytest.Config) -> Any:
    if PLACED:
        return f"celery-suite placeholders (missing in celeriac): {', '.join(PLACED)}"
    return "celery-suite placeholders: none needed"
