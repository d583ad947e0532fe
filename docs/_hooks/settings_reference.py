"""MkDocs hook: the settings reference, generated at build time.

``docs/reference/settings.md`` holds two markers that this hook replaces when the page
is built (nothing generated is committed):

- ``<!-- settings-table -->``: every field of ``celeriac.settings.Settings`` in source
  order, with its type, default and docstring (read from the source with ``ast``: a
  dataclass field's docstring is the string literal right after it), its environment
  variable, and the Celery names that set it (``celeriac.config`` and
  ``celeriac._celery_names``).
- ``<!-- celery-settings -->``: each of Celery's setting names and what celeriac does with
  it: implemented, converted, accepted with a warning (harmless) or refused, with the
  reason ``celeriac.config`` gives.

A field without a docstring is a build warning, so ``mkdocs build --strict`` (``make
docs``, ``tests/unit/test_docs.py``) fails until it has one.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import textwrap
from collections import defaultdict
from typing import Any

log = logging.getLogger("mkdocs.hooks.settings_reference")

SETTINGS_PAGE = "reference/settings.md"
TABLE_MARK = "<!-- settings-table -->"
CELERY_MARK = "<!-- celery-settings -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != SETTINGS_PAGE:
        return markdown
    if TABLE_MARK not in markdown or CELERY_MARK not in markdown:
        log.warning("%s: the markers %s and %s must both be on the page", SETTINGS_PAGE,
                    TABLE_MARK, CELERY_MARK)
        return markdown
    return (markdown.replace(TABLE_MARK, settings_markdown())
            .replace(CELERY_MARK, celery_markdown()))


# -- reading the code ---------------------------------------------------------------------

def field_docstrings() -> dict[str, str]:
    """Each ``Settings`` field's docstring, from the source."""
    from celeriac import settings

    tree = ast.parse(inspect.getsource(settings))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    docs: dict[str, str] = {}
    body = cls.body
    for node, after in zip(body, [*body[1:], None], strict=True):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def celery_sources() -> dict[str, list[str]]:
    """For each celeriac setting, the Celery names that set it: the same name, Celery's
    pre-4.0 uppercase names, and the converted settings (found by asking each converter
    what it sets)."""
    from celeriac import config
    from celeriac._celery_names import DEFAULTS, OLD_NAMES
    from celeriac.settings import Settings

    fields = [f.name for f in dataclasses.fields(Settings)]
    out: dict[str, list[str]] = defaultdict(list)
    for name in fields:
        if name in DEFAULTS:
            out[name].append(f"`{name}`")
    for old, new in sorted(OLD_NAMES.items()):
        if new in fields:
            out[new].append(f"`{old}`")
    for celery_name, target in converted_targets(config.CONVERTED).items():
        for name in target:
            out[name].append(f"`{celery_name}` (converted)")
    return out


def converted_targets(converted: dict[str, Any]) -> dict[str, list[str]]:
    """Which celeriac settings each converted Celery setting can set."""
    probes: list[Any] = [True, False, 1, 0, {"max_retries": 1}]
    targets: dict[str, list[str]] = {}
    for celery_name, convert in converted.items():
        names: list[str] = []
        for value in probes:
            try:
                changes = convert(value)
            except Exception:  # a probe of the wrong type: the converter refuses it
                continue
            names.extend(n for n in changes if n not in names)
        targets[celery_name] = names
    return targets


# -- rendering ----------------------------------------------------------------------------

def _code(text: str) -> str:
    return f"`{text}`"


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:  # pragma: no cover - every setting has a default
        return "(required)"
    text = repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024 * 1024:
        text += f" ({value / (1024 * 1024):g} MiB)" if value % (1024 * 1024) == 0 else ""
    return _code(text)


def _rst_to_md(text: str) -> str:
    """Docstrings use reStructuredText's double backticks; Markdown reads them as code
    spans already, so only paragraphs need joining."""
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    return "\n\n".join(paragraphs)


def settings_markdown() -> str:
    from celeriac.settings import ENV_PREFIX, Settings

    docs = field_docstrings()
    sources = celery_sources()
    parts: list[str] = []
    for field in dataclasses.fields(Settings):
        name = field.name
        doc = docs.get(name)
        if not doc:
            log.warning("Settings.%s has no docstring: the settings reference needs one "
                        "(a string literal right after the field in "
                        "src/celeriac/settings.py)", name)
            doc = ""
        celery = sources.get(name)
        lines = [
            f"### `{name}` {{ #{name} }}",
            "",
            f"Type: {_code(str(field.type))} · Default: {_default(field)} · "
            f"Environment: `{ENV_PREFIX}{name.upper()}`",
            "",
        ]
        if celery:
            lines += [f"Celery: {', '.join(celery)}", ""]
        else:
            lines += ["Celery: none (celeriac's own)", ""]
        lines += [_rst_to_md(doc), ""]
        parts.append("\n".join(lines))
    return "\n".join(parts)


def celery_markdown() -> str:
    from celeriac import config
    from celeriac._celery_names import DEFAULTS, UNSET
    from celeriac.settings import Settings

    fields = {f.name for f in dataclasses.fields(Settings)}
    targets = converted_targets(config.CONVERTED)
    counts: dict[str, int] = defaultdict(int)
    rows: list[str] = []
    for name in sorted(DEFAULTS):
        default = DEFAULTS[name]
        shown = "(not a plain value)" if default is UNSET else _code(repr(default))
        if name in fields:
            fate, what = "implemented", f"the setting [`{name}`](#{name})"
        elif name in config.CONVERTED:
            fate = "converted"
            links = ", ".join(f"[`{t}`](#{t})" for t in targets[name])
            doc = inspect.getdoc(config.CONVERTED[name])
            what = f"sets {links}" if links else "converted"
            if name in ("task_reject_on_worker_lost", "task_retry_on_worker_lost"):
                what = f"`False` sets {links} to 1"
            elif doc and config.CONVERTED[name].__name__ != "<lambda>":
                what = f"{what}: {doc}"
        elif name in config.HARMLESS:
            fate, what = "accepted with a warning", config.HARMLESS[name]
        elif name in config.REFUSED:
            fate, what = "refused", config.REFUSED[name]
        elif name.startswith(config._OTHER_BACKENDS):
            fate, what = "refused", config._BACKENDS_REASON
        else:
            fate, what = "unknown", "not classified (a test in tests/unit/test_config.py fails)"
            log.warning("Celery setting %s is not classified by celeriac.config", name)
        counts[fate] += 1
        what = what.replace("|", "\\|")
        rows.append(f"| `{name}` | {shown} | {fate} | {what} |")
    summary = ", ".join(f"{n} {fate}" for fate, n in sorted(counts.items()))
    head = textwrap.dedent(f"""\
        {len(DEFAULTS)} names ({summary}).

        | Celery setting | Celery's default | in celeriac | what it does here |
        |---|---|---|---|
        """)
    return head + "\n".join(rows) + "\n"
