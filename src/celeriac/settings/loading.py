"""Where an app's configuration and tasks come from: an object named by a string
(``config_from_object("proj.celeryconfig")``) and Django's installed apps
(``autodiscover_tasks()``)."""

from __future__ import annotations

import importlib

from ..errors import ConfigurationError


def load_object(obj: object | str) -> object:
    """A module named ``"pkg.mod"`` (or an attribute, ``"pkg.mod:attr"``), else ``obj``."""
    if not isinstance(obj, str):
        return obj
    module_name, _, attr = obj.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import configuration {obj!r}: {exc}") from exc
    if not attr:
        return module
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"configuration {obj!r}: {module_name} has no "
                                 f"attribute {attr!r}") from None


def django_apps() -> list[str]:
    try:  # deferred: Django is optional
        from django.conf import settings
    except ImportError:
        return []
    return list(getattr(settings, "INSTALLED_APPS", ())) if settings.configured else []
