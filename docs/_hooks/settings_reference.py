"""MkDocs hook: the settings reference, generated at build time.

``docs/reference/settings.md`` holds two markers that this hook replaces when the page
is built (nothing generated is committed):

- ``<!-- settings-table -->``: every field of ``celeriac.settings.Settings`` in source
  order, with its type, default and docstring (read from the source with ``ast``: a
  dataclass field's docstring is the string literal right after it), its environment
  variable, and the Celery names that set it (``celeriac.settings.config`` and
  ``celeriac.settings.celery_names``).
- ``<!-- celery-settings -->``: each of Celery's setting names and what celeriac does with
  it: implemented, converted, accepted with a warning (harmless) or refused, with the
  reason ``celeriac.settings.config`` gives.

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
    from celeriac.settings import Settings, config
    from celeriac.settings.celery_names import DEFAULTS, OLD_NAMES

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


PROBES: list[Any] = [True, False]
"""Values each converter is asked about, to learn what it sets and how; a converter that
refuses both takes a dict (Celery's retry policy) and is asked about ``DICT_PROBE``."""
DICT_PROBE = {"max_retries": 7}


def conversions(convert: Any) -> list[tuple[str, str]]:
    """``(celeriac setting, how)`` pairs for one converter of ``config.CONVERTED``, found
    by calling it with the probes; ``how`` has ``{target}`` where the setting goes."""
    out: list[tuple[str, str]] = []
    answers: list[tuple[Any, dict[str, Any]]] = []
    for probe in PROBES:
        try:
            answers.append((probe, convert(probe)))
        except Exception:  # a probe of the wrong type: the converter refuses it
            continue
    if not answers:
        answers.append((DICT_PROBE, convert(DICT_PROBE)))
    for probe, changes in answers:
        for name, value in changes.items():
            if value is probe:
                how = "sets {target} to the same value"
            elif probe is DICT_PROBE and value == DICT_PROBE["max_retries"]:
                how = "its `max_retries` sets {target}"
            else:
                how = f"`{probe!r}` sets {{target}} to `{value!r}`"
            if (name, how) not in out:
                out.append((name, how))
    return out


def converted_targets(converted: dict[str, Any]) -> dict[str, list[str]]:
    """Which celeriac settings each converted Celery setting can set."""
    targets: dict[str, list[str]] = {}
    for celery_name, convert in converted.items():
        names: list[str] = []
        for name, _ in conversions(convert):
            if name not in names:
                names.append(name)
        targets[celery_name] = names
    return targets


def env_settable(name: str) -> bool:
    """Whether ``Settings.from_env()`` can spell this setting (plain values only)."""
    from celeriac import settings
    from celeriac.errors import ConfigurationError

    try:
        settings._parse(name, settings._HINTS[name], "1")
    except ConfigurationError as exc:
        return "cannot be set from the environment" not in str(exc)
    return True


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
        env = (f"`{ENV_PREFIX}{name.upper()}`" if env_settable(name)
               else "(not from the environment)")
        lines = [
            f"### `{name}` {{ #{name} }}",
            "",
            f"Type: {_code(str(field.type))} · Default: {_default(field)} · "
            f"Environment: {env}",
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
    from celeriac.settings import Settings, config
    from celeriac.settings.celery_names import DEFAULTS, UNSET

    fields = {f.name for f in dataclasses.fields(Settings)}
    counts: dict[str, int] = defaultdict(int)
    rows: list[str] = []
    for name in sorted(DEFAULTS):
        default = DEFAULTS[name]
        shown = "(not a plain value)" if default is UNSET else _code(repr(default))
        if name in fields:
            fate, what = "implemented", f"the setting [`{name}`](#{name})"
        elif name in config.CONVERTED:
            fate = "converted"
            what = "; ".join(how.format(target=f"[`{target}`](#{target})")
                             for target, how in conversions(config.CONVERTED[name]))
        elif name in config.HARMLESS:
            fate, what = "accepted with a warning", config.HARMLESS[name]
        elif name.startswith(config.OTHER_SERVICES):
            fate, what = "accepted with a warning", config._OTHER_SERVICES_REASON
        elif name in config.REFUSED:
            fate, what = "refused", config.REFUSED[name]
        elif name.startswith(config._OTHER_BACKENDS):
            fate, what = "refused", config._DATABASE_REASON
        else:
            fate, what = "unknown", "not classified (a test in tests/unit/test_config.py fails)"
            log.warning("Celery setting %s is not classified by celeriac.settings.config", name)
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
