"""Run Celery's own integration suite against celeriac, ported by the rename alone.

``make celery-suite`` runs this. Celery's suite (``t/integration`` of the celery 5.5.3
sdist) is the definition of what "a Celery project ports by renaming" has to mean, so
nothing of it is edited but the rename a porting team applies:

1. download ``celery==5.5.3``'s sdist with pip (the package registry) into
   ``.celery-suite/`` (git-ignored: nothing of Celery's is committed);
2. unpack its ``t/`` and ``pyproject.toml`` (Celery's pytest settings) only, never its
   ``celery/`` package, so nothing of Celery can be imported by mistake;
3. rename, in code only (Python identifiers found by ``tokenize``, never strings or
   comments): the name ``celery`` (the package: ``import celery``, ``from celery.x
   import``, ``celery.exceptions.X``) to ``celeriac``, and ``Celery`` in an identifier
   (the app class) to ``Celeriac``. Fixture names (``celery_app``,
   ``celery_session_worker``...) stay: celeriac's plugin keeps Celery's names. Task names
   in strings (``"celery.ping"``) and the ``celery`` default queue stay too;
4. write ``integration-tests-config.json``, Celery's own way to override the suite's
   ``celery_config`` (see its ``t/integration/conftest.py``). It resets the four
   ``cassandra_*`` settings the suite passes for Celery's Cassandra backend to Celery's
   defaults: celeriac refuses settings of a backend it does not have (no Cassandra
   backend), and with them set no test could make its app;
5. run ``pytest t/integration`` in a virtualenv of its own (``.celery-suite/venv``:
   celeriac from this checkout, with the suite's test dependencies: pytest-subtests,
   pytest-timeout, pydantic, cryptography, and redis-py below 6, as kombu 5.5 pins it),
   with ``TEST_BROKER`` and ``TEST_BACKEND``
   both ``redis://127.0.0.1:6379/11`` (a database of its own, emptied before the run;
   the bench's Celery side has 14);
6. print the counts and the failures grouped by cause, from pytest's JUnit XML.

Left out (``EXCLUDED``), each with its reason: the test modules of backends for services
celeriac does not support.

Options: ``--keep`` reuses the unpacked tree (to edit by hand while investigating),
extra arguments after ``--`` go to pytest, ``--db N`` picks the Redis database.
``--placeholders`` is for measuring while celeriac still lacks names the suite imports at
module level (``scripts/celery_suite_placeholders.py``: each placeholder makes only the
tests that use it fail, instead of its whole module failing to collect); the number that
counts is the one without it.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tokenize
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

CELERY_VERSION = "5.5.3"
ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".celery-suite"
SDIST_DIR = WORK / "sdist"
TREE = WORK / f"celery-{CELERY_VERSION}"
VENV = WORK / "venv"
JUNIT = WORK / "junit.xml"
SUITE_DEPS = ["pytest>=8", "pytest-timeout>=2.2", "pytest-subtests>=0.14.1", "pydantic>=2",
              "cryptography",
              # The redis-py Celery 5.5.3's suite runs with (kombu 5.5's redis extra). From
              # 6.0 on, redis-py's clients time out reading after 5 s and retry: the suite's
              # BLPOPs of 10 s and more (its own client, ``get_redis_connection``) then
              # fail after about a minute instead of returning at their timeout.
              "redis[hiredis]>=5.0.1,!=5.0.2,<=5.2.1"]
PER_TEST_TIMEOUT = 300  # seconds: Celery's own for its slow tests (``_timeout``); its
# flag_allow_error_cb tests wait 10 s for what must not happen, twice per header, 7 headers
EXCLUDED = {
    "t/integration/test_backend.py": "Azure Block Blob result backend: celeriac has none "
                                     "(results: Redis, PostgreSQL, SQLite)",
}
CASSANDRA_DEFAULTS = {"cassandra_servers": None, "cassandra_keyspace": None,
                      "cassandra_table": None, "cassandra_read_consistency": None,
                      "cassandra_write_consistency": None}


def log(message: str) -> None:
    print(f"celery-suite: {message}", flush=True)


# -- 1, 2: the sdist ----------------------------------------------------------------------
def download() -> Path:
    SDIST_DIR.mkdir(parents=True, exist_ok=True)
    found = sorted(SDIST_DIR.glob(f"celery-{CELERY_VERSION}.tar.gz"))
    if not found:
        log(f"downloading celery {CELERY_VERSION}'s sdist")
        subprocess.run([sys.executable, "-m", "pip", "download", f"celery=={CELERY_VERSION}",
                        "--no-deps", "--no-binary", ":all:", "-d", str(SDIST_DIR), "-q"],
                       check=True)
        found = sorted(SDIST_DIR.glob(f"celery-{CELERY_VERSION}.tar.gz"))
    if not found:
        raise SystemExit(f"no celery-{CELERY_VERSION}.tar.gz in {SDIST_DIR} after pip download")
    return found[0]


def unpack(sdist: Path) -> None:
    if TREE.exists():
        shutil.rmtree(TREE)
    prefix = f"celery-{CELERY_VERSION}/"
    wanted = (f"{prefix}t/", f"{prefix}pyproject.toml")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(wanted) and (m.isfile() or m.isdir())]
        tar.extractall(WORK, members=members, filter="data")


# -- 3: the rename ------------------------------------------------------------------------
def rename_source(source: str) -> str:
    """``source`` with the identifier ``celery`` as ``celeriac`` and ``Celery`` in any
    identifier as ``Celeriac``; strings and comments untouched."""
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.NAME:
            continue
        new = "celeriac" if tok.string == "celery" else tok.string.replace("Celery", "Celeriac")
        if new != tok.string:
            (row, col), (_, end) = tok.start, tok.end
            edits.append((row, col, end, new))
    for row, col, end, new in reversed(edits):  # right to left keeps the columns valid
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[end:]
    return "".join(lines)


def rename_tree() -> int:
    changed = 0
    for path in sorted((TREE / "t").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        renamed = rename_source(text)
        if renamed != text:
            path.write_text(renamed, encoding="utf-8")
            changed += 1
    return changed


def write_config_overrides() -> None:
    (TREE / "integration-tests-config.json").write_text(json.dumps(CASSANDRA_DEFAULTS,
                                                                   indent=2))


# -- 5: the virtualenv and the run ----------------------------------------------------------
def ensure_venv() -> Path:
    python = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()
                            + " ".join(SUITE_DEPS).encode()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    log(f"making the suite's virtualenv in {VENV.relative_to(ROOT)}")
    if VENV.exists():
        shutil.rmtree(VENV)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", f"{ROOT}[redis]",
                    *SUITE_DEPS], check=True)
    stamp.write_text(wanted)
    return python


def empty_db(python: Path, url: str) -> None:
    code = "import redis, sys; redis.Redis.from_url(sys.argv[1]).flushdb()"
    subprocess.run([str(python), "-c", code, url], check=True)


def run_pytest(python: Path, url: str, extra: list[str], placeholders: bool) -> int:
    env = {**os.environ, "TEST_BROKER": url, "TEST_BACKEND": url,
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    paths = [] if any(a.startswith("t/") for a in extra) else ["t/integration"]
    argv = [str(python), "-m", "pytest", *paths, "-p", "no:cacheprovider",
            "-o", "testpaths=t/integration", f"--timeout={PER_TEST_TIMEOUT}",
            "-rN", "-q", f"--junitxml={JUNIT}", "--continue-on-collection-errors",
            *(f"--ignore={path}" for path in EXCLUDED), *extra]
    if placeholders:
        env["PYTHONPATH"] = str(ROOT / "scripts")
        argv[3:3] = ["-p", "celery_suite_placeholders"]  # after "-m pytest"
    for path, reason in EXCLUDED.items():
        log(f"left out {path}: {reason}")
    log(f"running: {' '.join(argv[1:])}  (in {TREE.relative_to(ROOT)}, on {url})")
    return subprocess.run(argv, cwd=TREE, env=env).returncode


# -- 6: the summary -----------------------------------------------------------------------
_NOISE = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<id>"),
    (re.compile(r"0x[0-9a-f]+"), "0x.."),
    (re.compile(r"\b\d+(\.\d+)?\b"), "N"),
]


def cause(element: ET.Element) -> str:
    """One line saying why a test failed: the exception's type and message, with ids
    and numbers blanked so that the same cause groups together."""
    message = (element.get("message") or "").strip()
    raised = [line[1:].strip() for line in (element.text or "").splitlines()
              if line.startswith("E ")]
    # pytest's own words ("collection failure", "failed on setup with ...") say where,
    # the traceback's first E line says what.
    if raised and (not message or message == "collection failure"
                   or message.startswith("failed on")):
        where = "setup: " if "setup" in message else ""
        where = "teardown: " if "teardown" in message else where
        message = where + raised[0]
    first = message.splitlines()[0] if message else element.get("type", "?")
    for pattern, repl in _NOISE:
        first = pattern.sub(repl, first)
    return first[:160]


def classify(case: ET.Element) -> tuple[str, str | None]:
    """``(outcome, cause)`` of one test case of the JUnit report."""
    failure, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
    if failure is not None and (failure.get("message") or "").startswith("[XPASS"):
        return "xpassed", None  # Celery's own xfail (strict) that passes here: left out
    if failure is not None:
        return "failed", cause(failure)
    if error is not None:
        return "error", cause(error)
    if skipped is not None:
        if skipped.get("type") == "pytest.xfail":
            return "xfailed", None
        return "skipped", cause(skipped)
    return "passed", None


def summarize(reports: list[Path] | None = None) -> dict[str, int]:
    """Print the counts and the causes of the JUnit ``reports`` (the last run's): one
    count per test, the later report's outcome winning for a test run twice."""
    outcomes: dict[str, tuple[str, str | None]] = {}
    for report in reports or [JUNIT]:
        if not report.exists():
            log(f"no JUnit report {report}: pytest did not get as far as running tests")
            continue
        for case in ET.parse(report).iter("testcase"):
            if not case.get("name"):
                continue  # the test an INTERNALERROR interrupted: no outcome recorded
            name = f"{case.get('classname', '')}.{case.get('name', '')}".strip(".")
            outcomes[name.removeprefix("t.integration.")] = classify(case)
    counts = dict.fromkeys(("collected", "passed", "failed", "error", "skipped", "xfailed",
                            "xpassed"), 0)
    causes: dict[str, list[str]] = defaultdict(list)
    skips: dict[str, list[str]] = defaultdict(list)
    for name, (outcome, why) in outcomes.items():
        if name.startswith("pytest"):  # pytest's own INTERNALERROR: no test of the suite
            causes[f"(pytest) {why}"].append(name)
            continue
        counts["collected"] += 1
        counts[outcome] += 1
        if why is not None:
            (skips if outcome == "skipped" else causes)[why].append(name)
    print_summary(counts, causes, skips)
    return counts


def print_summary(counts: dict[str, int], causes: dict[str, list[str]],
                  skips: dict[str, list[str]]) -> None:
    applicable = counts["collected"] - counts["skipped"] - counts["xfailed"] - counts["xpassed"]
    print()
    print("celery-suite: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if applicable:
        print(f"celery-suite: {counts['passed']} of {applicable} applicable tests pass "
              f"({100 * counts['passed'] / applicable:.0f}%; Celery's own xfails and the "
              f"skipped left out)")
    for title, groups in (("skipped, by reason", skips),
                          ("failures and errors, by cause (most frequent first)", causes)):
        if not groups:
            continue
        print(f"\n{title}:")
        for reason, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(names):4d}  {reason}")
            for name in names[:8]:
                print(f"          {name}")
            if len(names) > 8:
                print(f"          ... and {len(names) - 8} more")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--keep", action="store_true",
                        help="reuse the unpacked, renamed tree as it is (edited by hand)")
    parser.add_argument("--db", type=int, default=11, help="Redis database (default 11)")
    parser.add_argument("--placeholders", action="store_true",
                        help="stand in for names celeriac lacks that the suite imports at "
                             "module level (to measure the rest; not the headline number)")
    parser.add_argument("--summary-only", nargs="*", type=Path, metavar="JUNIT",
                        help="print the summary of the last run's JUnit report (or of "
                             "these, merged: a test's later outcome wins)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.summary_only is not None:
        summarize(args.summary_only or None)
        return 0
    WORK.mkdir(exist_ok=True)
    if not (args.keep and TREE.exists()):
        unpack(download())
        log(f"renamed celery -> celeriac in {rename_tree()} files")
        write_config_overrides()
    python = ensure_venv()
    url = f"redis://127.0.0.1:6379/{args.db}"
    empty_db(python, url)
    JUNIT.unlink(missing_ok=True)
    code = run_pytest(python, url, args.pytest_args, args.placeholders)
    summarize()
    return code


if __name__ == "__main__":
    sys.exit(main())
