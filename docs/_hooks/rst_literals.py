"""Griffe extension for the API reference: the docstrings write reStructuredText's
literal-block marker (``text::`` or a lone ``::`` before an indented block), which
Markdown would print as is. Markdown already reads the indented block as code, so only
the marker goes: ``text::`` becomes ``text:`` and a lone ``::`` line disappears."""

from __future__ import annotations

import re
from typing import Any

import griffe

_LONE = re.compile(r"^[ \t]*::[ \t]*\n", re.MULTILINE)
_TRAILING = re.compile(r"(\S)::[ \t]*\n(?=[ \t]*\n)")


class RstLiterals(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is not None:
            text = _LONE.sub("", obj.docstring.value)
            obj.docstring.value = _TRAILING.sub(r"\1:\n", text)
