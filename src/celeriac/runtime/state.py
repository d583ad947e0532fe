"""The current app and ``@shared_task``: tasks a library defines before any app exists.

Celery's model, kept because reusable apps (Django apps, libraries) rely on it: every
``Celeriac`` made becomes the current app (unless ``set_as_current=False``), and a
shared task is registered with every app, present and future. ``shared_task`` returns a
proxy that resolves to the current app's task, so ``mylib.tasks.send.delay()`` uses
whichever app the process configured.
"""

from __future__ import annotations

import importlib
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..tasks import Task

_lock = threading.Lock()
_apps: weakref.WeakSet[Celeriac] = weakref.WeakSet()
_current: Celeriac | None = None
_shared: list[tuple[Callable[..., Any], dict[str, Any]]] = []
_default_app: Callable[[], Celeriac] | None = None
"""Makes the default app; ``app.py`` sets it (``set_default_app``) as it is imported. This
module is below the app: it never imports it by name (see ``get_current_app``)."""


def register_app(app: Celeriac, make_current: bool) -> None:
    global _current
    with _lock:
        _apps.add(app)
        if make_current:
            _current = app
        shared = list(_shared)
    for fn, options in shared:
        app._register(fn, dict(options))


def set_current(app: Celeriac) -> None:
    global _current
    _current = app


def set_default_app(factory: Callable[[], Celeriac]) -> None:
    global _default_app
    _default_app = factory


def get_current_app() -> Celeriac:
    """The app made last (or set with ``app.set_current()``); a default app if none."""
    app = _current
    if app is None:
        if _default_app is None:
            # ``import celeriac`` defers the app (start-up cost): a process that used only
            # submodules (``celeriac.result``) loads it here, which sets ``_default_app``.
            importlib.import_module("celeriac.app")
            assert _default_app is not None
        app = _default_app()  # registers itself as current
    return app


def shared_task(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """``@shared_task`` / ``@shared_task(bind=True, ...)``: a task of every app."""

    def decorate(f: Callable[..., Any]) -> SharedTask:
        with _lock:
            _shared.append((f, dict(options)))
            apps = list(_apps)
        for app in apps:
            app._register(f, dict(options))
        return SharedTask(f, options)

    return decorate(fn) if fn is not None else decorate


class SharedTask:
    """Stands for the task of this function in the current app."""

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        self._fn = fn
        self._options = options
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    def _task(self) -> Task[Any, Any]:
        app = get_current_app()
        name = self._options.get("name") or app._default_name(self._fn)
        task = app.tasks.get(name)
        if task is None:  # an app made with the registry emptied since: add it back
            task = app._register(self._fn, dict(self._options))
        return task

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._task(), attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._task()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<shared task {self._fn.__module__}.{self._fn.__qualname__}>"


class _CurrentApp:
    """``celeriac.current_app``: stands for the current app, as Celery's does
    (``current_app.send_task(...)``, ``current_app.conf``)."""

    def __getattr__(self, attr: str) -> Any:
        return getattr(get_current_app(), attr)

    def __repr__(self) -> str:
        return f"<current app: {get_current_app()!r}>"


current_app: Any = _CurrentApp()
