"""The registry of remote-control commands: ``@inspect_command`` and ``@control_command``.

A command is a function of the worker's ``ControlState`` and its keyword arguments that
returns the reply (a JSON-able value; Celery's shapes: ``{"ok": ...}`` /
``{"error": ...}`` for control commands, data for inspect commands). It runs on the
worker's event loop, so it must not block: it reads the worker's books and changes them,
and leaves anything slow to a task it starts.

``args`` is the schema: ``(name, type)`` pairs in positional order, which the command
line uses to convert its strings and the worker uses to check what it received. A
parameter of the function without a default is required. ``read_only`` commands are
those that change nothing; the others are refused by a worker whose
``worker_remote_control`` is ``"read-only"``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ControlError

if TYPE_CHECKING:
    from ..worker.control import ControlState

Handler = Callable[..., Any]
F = TypeVar("F", bound=Handler)
ArgType = type | tuple[type, ...]


@dataclass(frozen=True, slots=True)
class CommandSpec:
    name: str
    handler: Handler
    kind: str
    """"inspect" or "control"."""
    args: tuple[tuple[str, ArgType], ...]
    required: frozenset[str]
    read_only: bool
    help: str
    variadic: str | None = None
    """The one argument that takes the rest of the command line (``query_task ids...``)."""

    @property
    def signature(self) -> str:
        parts = []
        for name, _ in self.args:
            shown = f"{name}..." if name == self.variadic else name
            parts.append(f"<{shown}>" if name in self.required else f"[{shown}]")
        return " ".join(parts)

    def check(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """``arguments`` checked against the schema; ``ControlError`` names the problem."""
        known = dict(self.args)
        unknown = sorted(set(arguments) - set(known))
        if unknown:
            raise ControlError(f"{self.name}: unknown argument {unknown[0]!r} (takes "
                               f"{', '.join(known) or 'no arguments'})")
        missing = sorted(self.required - set(arguments))
        if missing:
            raise ControlError(f"{self.name}: missing argument {missing[0]!r}")
        for name, value in arguments.items():
            expected = known[name]
            if value is None and name not in self.required:
                continue
            if not isinstance(value, expected) or (isinstance(value, bool)
                                                   and bool not in _types(expected)):
                raise ControlError(f"{self.name}: argument {name!r} must be "
                                   f"{_describe(expected)}, got {type(value).__name__}")
        return dict(arguments)

    def call(self, state: ControlState, arguments: Mapping[str, Any]) -> Any:
        return self.handler(state, **self.check(arguments))


def _types(t: ArgType) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


def _describe(t: ArgType) -> str:
    return " or ".join(x.__name__ for x in _types(t))


COMMANDS: dict[str, CommandSpec] = {}
"""Every command by name (the worker's and the command line's one table)."""


def _register(kind: str, name: str | None, args: Sequence[tuple[str, ArgType]],
              read_only: bool, help: str | None, variadic: str | None
              ) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        cmd = name or fn.__name__
        params = inspect.signature(fn).parameters
        names = [p for p in params if p != "state"]
        declared = [a for a, _ in args]
        if sorted(names) != sorted(declared):
            raise TypeError(f"command {cmd!r}: args {declared} do not match the "
                            f"parameters {names}")
        required = frozenset(p for p in names if params[p].default is inspect.Parameter.empty)
        doc = help if help is not None else (inspect.getdoc(fn) or "").split("\n")[0]
        COMMANDS[cmd] = CommandSpec(cmd, fn, kind, tuple(args), required, read_only, doc,
                                    variadic)
        return fn

    return decorate


def inspect_command(name: str | None = None, *, args: Sequence[tuple[str, ArgType]] = (),
                    help: str | None = None, variadic: str | None = None
                    ) -> Callable[[F], F]:
    """Register a command that reads the worker's state (always read-only)."""
    return _register("inspect", name, args, True, help, variadic)


def control_command(name: str | None = None, *, args: Sequence[tuple[str, ArgType]] = (),
                    read_only: bool = False, help: str | None = None,
                    variadic: str | None = None) -> Callable[[F], F]:
    """Register a command that acts on the worker."""
    return _register("control", name, args, read_only, help, variadic)


def load() -> dict[str, CommandSpec]:
    """Every built-in command, registered (``celeriac.control``, imported before this
    module, imports the families, which registers them)."""
    return COMMANDS


def convert(spec: CommandSpec, words: Sequence[str]) -> dict[str, Any]:
    """Command-line words as the command's arguments, by the schema (Celery's CLI form:
    positional, in order; the variadic argument takes the rest as a list)."""
    out: dict[str, Any] = {}
    rest = list(words)
    for name, kind in spec.args:
        if not rest:
            break
        if name == spec.variadic:
            out[name] = [_word(spec, name, kind, w) for w in rest]
            rest = []
            break
        out[name] = _word(spec, name, kind, rest.pop(0))
    if rest:
        raise ControlError(f"{spec.name}: too many arguments (takes {spec.signature})")
    return out


def _word(spec: CommandSpec, name: str, kind: ArgType, word: str) -> Any:
    types = _types(kind)
    if list in types:  # a list argument given one word at a time
        return word
    for t in types:
        try:
            if t is bool:
                lowered = word.lower()
                if lowered in ("1", "true", "yes", "on"):
                    return True
                if lowered in ("0", "false", "no", "off"):
                    return False
                continue
            if t in (int, float, str):
                return t(word)
        except ValueError:
            continue
    raise ControlError(f"{spec.name}: argument {name!r} must be {_describe(kind)}, "
                       f"got {word!r}")
