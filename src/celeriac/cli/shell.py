"""``celeriac shell``: a Python shell with the app and its tasks at hand, as ``celery
shell`` has it (``app`` and ``celery``, each task by its short name)."""

from __future__ import annotations

import code
import importlib
import sys
from typing import Any

import click

import celeriac

from ..app import Celeriac
from .loader import AppLoader


def namespace(app: Celeriac, with_tasks: bool = True) -> dict[str, Any]:
    ns: dict[str, Any] = {
        "app": app, "celery": app, "celeriac": celeriac,
        "Task": celeriac.Task, "AsyncResult": celeriac.AsyncResult,
    }
    if with_tasks:
        for name, task in sorted(app.tasks.items()):
            if not name.startswith(("celeriac.", "celery.")):  # built-ins: map, starmap
                # As in Celery: of two tasks with one short name, the last (here by
                # full name) wins; both stay reachable as app.tasks[name].
                ns[name.rpartition(".")[2]] = task
    return ns


def _banner(ns: dict[str, Any]) -> str:
    names = ", ".join(sorted(ns))
    return (f"celeriac {celeriac.__version__} shell, Python {sys.version.split()[0]}\n"
            f"Available: {names}")


def python_shell(ns: dict[str, Any]) -> None:
    if sys.stdin.isatty():
        # Tab completion over the namespace, as Celery's fallback shell sets it up;
        # readline on a pipe would only write terminal control codes into the output.
        try:  # deferred: readline is optional (absent on some builds)
            import readline
            import rlcompleter
        except ImportError:
            pass
        else:
            readline.set_completer(rlcompleter.Completer(ns).complete)
            readline.parse_and_bind("tab: complete")
    code.interact(banner=_banner(ns), local=ns, exitmsg="")


def ipython_shell(ns: dict[str, Any]) -> None:
    ipython = importlib.import_module("IPython")
    ipython.start_ipython(argv=[], user_ns=ns)


def bpython_shell(ns: dict[str, Any]) -> None:
    bpython = importlib.import_module("bpython")
    bpython.embed(ns, banner=_banner(ns))


SHELLS = {"ipython": ("IPython", ipython_shell), "bpython": ("bpython", bpython_shell)}


def _available(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


@click.command()
@click.option("-I", "--ipython", "choice", flag_value="ipython", help="Use IPython.")
@click.option("-B", "--bpython", "choice", flag_value="bpython", help="Use bpython.")
@click.option("--python", "choice", flag_value="python", help="Use the plain Python shell.")
@click.option("-T", "--without-tasks", is_flag=True,
              help="Do not put the tasks in the namespace.")
@click.pass_obj
def shell(load: AppLoader, choice: str | None, without_tasks: bool) -> None:
    """Start a Python shell with app, celery (the app), celeriac and every task by name.

    IPython if installed, else bpython, else the plain Python shell.
    """
    ns = namespace(load(), with_tasks=not without_tasks)
    if choice == "python":
        python_shell(ns)
        return
    if choice is not None:
        module, run = SHELLS[choice]
        if not _available(module):
            raise click.ClickException(f"{module} is not installed (pip install "
                                       f"{module.lower()}); or use --python")
        run(ns)
        return
    for module, run in SHELLS.values():
        if _available(module):
            run(ns)
            return
    python_shell(ns)
