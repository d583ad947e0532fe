"""Flow control's cost where a task is sent: the unique check per ``delay()``
(``bench/run.py`` prints it; alone: ``python bench/flow.py``).

celeriac on the bench's Redis database (15), in this process, no worker (what is
measured is the caller's side). Per run, ``--n`` calls each:

- ``plain delay()``: a task without flow options, one Redis round trip per call;
- ``unique, new key``: a ``unique_for`` task with new arguments each call: the lock is
  taken (one store round trip, ``hold``), then the message published;
- ``unique, held``: the same arguments again while the first call's lock is held: one
  round trip, nothing published (the holder's ``AsyncResult``).

Microseconds per call, medians of the runs; the unique check's cost is the second row
less the first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import CELERIAC_REDIS_DB, CELERIAC_REDIS_URL, console, flush_redis_db
from rich.table import Table

from celeriac import Celeriac

app = Celeriac("benchflow", broker_url=CELERIAC_REDIS_URL, result_backend=CELERIAC_REDIS_URL)


@app.task
def plain(i: int) -> int:
    return i


@app.task(unique_for=600)
def unique(i: int) -> int:
    return i


def _per_call(n: int, call: Callable[[int], object]) -> float:
    began = time.perf_counter()
    for i in range(n):
        call(i)
    return (time.perf_counter() - began) / n * 1e6


def _unique_from(base: int) -> Callable[[int], object]:
    return lambda i: unique.delay(base + i)


def measure(n: int = 5000, runs: int = 3) -> dict[str, float]:
    """Microseconds per call of each row (medians of ``runs``)."""
    rows: dict[str, list[float]] = {"plain delay()": [], "unique, new key": [],
                                    "unique, held": []}
    try:
        for run in range(runs):
            flush_redis_db(CELERIAC_REDIS_DB)
            plain.delay(-1)  # connections made before the clock starts
            rows["plain delay()"].append(_per_call(n, plain.delay))
            base = (run + 1) * n * 10
            rows["unique, new key"].append(_per_call(n, _unique_from(base)))
            rows["unique, held"].append(_per_call(n, _unique_from(base)))
    finally:
        app.close()
        flush_redis_db(CELERIAC_REDIS_DB)
    return {k: statistics.median(v) for k, v in rows.items()}


def measure_if(enabled: bool, n: int, runs: int) -> dict[str, float] | None:
    """``measure`` for ``bench/run.py`` (at most 5,000 calls and 3 runs), unless
    ``--no-flow``."""
    return measure(min(n, 5000), min(runs, 3)) if enabled else None


def show(found: dict[str, float] | None) -> None:
    if found is not None:
        console.print(table(found))


def table(found: dict[str, float]) -> Table:
    t = Table(title="flow control: the unique check per delay() (Redis, us per call)")
    t.add_column("call")
    t.add_column("us/call", justify="right")
    for name, us in found.items():
        t.add_row(name, f"{us:.1f}")
    t.caption = (f"unique check's cost: {found['unique, new key'] - found['plain delay()']:.1f}"
                 " us per delay() (one store round trip)")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    opts = parser.parse_args(argv)
    console.print(table(measure(opts.n, opts.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())


FAIR_TARGET = 0.20
"""The fair queue may cost the drain at most this share."""


def fair_cost(outcomes: list[Any]) -> None:
    """The drain and the enqueue on a fair queue (``redis-fair``, ``sqlite-fair``) beside
    the plain queue's (``redis``, ``sqlite``), from this run: the median of run-by-run
    shares, as ``report.events_cost`` (the runs are interleaved)."""
    by_key = {o.system.key: o for o in outcomes if o.runs}
    for broker in ("redis", "sqlite"):
        plain, fair = by_key.get(broker), by_key.get(f"{broker}-fair")
        if plain is not None and fair is not None:
            _fair_line(broker, plain, fair)


def _fair_line(broker: str, plain: Any, fair: Any) -> None:
    pairs = list(zip(plain.runs, fair.runs, strict=False))
    drain = statistics.median(1 - b.drain / a.drain for a, b in pairs)
    enqueue = statistics.median(1 - b.enqueue / a.enqueue for a, b in pairs)
    verdict = "[green]yes[/]" if drain <= FAIR_TARGET else "[red]no[/]"
    console.print(f"fair queue ({broker}): drain {fair.median(lambda r: r.drain):,.0f}/s against "
                  f"{plain.median(lambda r: r.drain):,.0f}/s on a plain queue (medians), "
                  f"{drain:+.1%} slower run by run (target <= {FAIR_TARGET:.0%}: {verdict}); "
                  f"enqueue {enqueue:+.1%} slower")
