"""The tables and lines printed after the runs: every figure (``report``, ``details``),
celeriac against its peers and the targets (``ratio_table``), the 10 ms-sleep drains
(``sleep_table``), the canvas rows' failures, the cost of task events, prefork against
solo."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import tasks as bench_tasks
from harness import PEERS, console
from measuring import Outcome, Run
from rich.markup import escape
from rich.table import Table


def cell(values: list[float | None], fmt: str) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    mid = format(statistics.median(got), fmt)
    if len(got) == 1:
        return mid
    return f"{mid}\n[dim]{format(min(got), fmt)}-{format(max(got), fmt)}[/]"


def ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def report(outcomes: list[Outcome], opts: argparse.Namespace) -> Table:
    table = Table(title=f"no-op tasks: N={opts.n:,} per run, median of {opts.runs} run(s) "
                        "(min-max below)")
    columns = [("system", "left"), ("enqueue\ndelay()\ntasks/s", "right")]
    if opts.batch:
        columns.append(("enqueue\nbulk (best)\ntasks/s", "right"))
    columns.append(("drain\nrun + results\ntasks/s", "right"))
    if opts.latency:
        columns += [("round trip\np50\nms", "right"), ("round trip\np99\nms", "right")]
    canvas = show_canvas(outcomes, opts)
    if canvas:
        columns += [(f"group join\n{opts.canvas_n:,} tasks\nms", "right"),
                    (f"chord\n{opts.chord_n:,} + body\nms", "right")]
    columns.append(("worker\nstartup\nms", "right"))
    columns.append(("worker RSS\nmain / child\nMiB", "right"))
    for title, justify in columns:
        table.add_column(title, justify=justify)
    for o in outcomes:
        if not o.runs:
            cols = ["[red]failed[/]"] * (len(columns) - 1)
        else:
            cols = [cell([r.enqueue for r in o.runs], ",.0f")]
            if opts.batch:
                cols.append(cell([r.best_bulk for r in o.runs], ",.0f"))
            cols.append(cell([r.drain for r in o.runs], ",.0f"))
            if opts.latency:
                cols += [cell([ms(r.p50) for r in o.runs], ".2f"),
                         cell([ms(r.p99) for r in o.runs], ".2f")]
            if canvas:
                cols += [canvas_cell(o, "group"), canvas_cell(o, "chord")]
            cols.append(cell([r.startup * 1000 for r in o.runs], ",.0f"))
            parent = o.median(lambda r: r.rss_parent)
            child = o.median(lambda r: r.rss_child)
            cols.append("-" if parent is None else
                        f"{parent:.0f} / {child:.0f}" if child is not None else f"{parent:.0f}")
        table.add_row(o.system.name + (" [red](incomplete)[/]" if o.error and o.runs else ""),
                      *cols)
    return table


def show_canvas(outcomes: list[Outcome], opts: argparse.Namespace) -> bool:
    return bool(opts.canvas and any(o.system.canvas for o in outcomes))


def canvas_cell(o: Outcome, row: str) -> str:
    """The row's median ms (min-max below), and how many runs it failed in, if any."""
    if not o.system.canvas:
        return "-"
    failed = sum(1 for r in o.runs if row in r.canvas_errors)
    shown = cell([ms(getattr(r, row)) for r in o.runs], ",.0f")
    if not failed:
        return shown
    note = f"[red]failed {failed}/{len(o.runs)}[/]"
    return note if shown == "-" else f"{shown}\n{note}"


def canvas_failures(outcomes: list[Outcome]) -> bool:
    """Print why each canvas row failed (first run's reason per row); True if any did."""
    any_failed = False
    for o in outcomes:
        for row in ("group", "chord"):
            reasons = [(i, r.canvas_errors[row]) for i, r in enumerate(o.runs, 1)
                       if row in r.canvas_errors]
            if reasons:
                any_failed = True
                i, why = reasons[0]
                console.print(f"[red]{o.system.name}: the {row} row failed in "
                              f"{len(reasons)} of {len(o.runs)} run(s); run {i}: "
                              f"{escape(why)}[/]")
    return any_failed


def details(outcomes: list[Outcome], opts: argparse.Namespace) -> None:
    for o in outcomes:
        system = o.system
        versions = getattr(system, "versions", None)
        pinned = (" (" + ", ".join(f"{k} {v}" for k, v in versions.items()) + ")"
                  if versions else "")
        console.print(f"[dim]{system.name}{pinned}: {system.detail}[/]")
        if opts.batch and o.runs:
            for method, how in system.bulk_methods.items():
                rate = o.median(lambda r, m=method: r.bulk.get(m))  # type: ignore[misc]
                shown = f"{rate:,.0f}/s" if rate else "-"
                console.print(f"[dim]    bulk {method}: {shown} = "
                              f"{how.replace('{batch}', str(opts.batch))}[/]")


TARGETS: dict[str, tuple[str, float]] = {
    # metric -> ("ratio", celeriac / Celery at least) or ("ceiling", seconds)
    "enqueue": ("ratio", 5.0),
    "bulk_vs_delay": ("ratio", 20.0),
    "bulk": ("ratio", 20.0),
    "drain": ("ratio", 10.0),
    "p50": ("ceiling", 0.0007),
    "p99": ("ceiling", 0.0012),
    "group": ("ratio", 10.0),
    "chord": ("ratio", 10.0),
}
REFERENCE = {"enqueue": 1650.0, "drain": 700.0, "p50": 0.0038}
"""Celery on the development machine when the targets were set (enqueues/s, drained/s,
p50 seconds): printed beside this run's Celery for scale."""


PEER_DRAIN_TARGETS = {"dramatiq": 2.0, "huey": 2.0}
"""celeriac's drain over Dramatiq's (2 processes x 8 threads) and Huey's (2 processes),
for both tasks (issue 30), besides TARGETS' 10x Celery."""
SPREAD_TARGET = 0.15
"""Every run's drain within this share of the median of celeriac's runs (issue 30)."""


SLEEP_TARGETS = {"celery-threads-sleep": 5.0, "dramatiq-sleep": 2.0}
"""Issue 16: celeriac's async drain of 10 ms tasks over Celery's threads x16 and Dramatiq's
2 x 8, in the same run."""
SLEEP_IN_FLIGHT = 200
"""Async tasks in flight in ``redis-async-sleep`` (2 children x 100)."""


def sleep_table(outcomes: list[Outcome]) -> Table | None:
    """The 10 ms-sleep drains side by side, the targets, and the ceiling: 200 in flight
    allow 200 / 10 ms = 20,000/s, and the CPU no more than the no-op drain of this run
    (the same worker doing everything but the wait), whichever is lower."""
    by_key = {o.system.key: o for o in outcomes if o.runs}
    rows = [o for k, o in by_key.items() if k.endswith("-sleep")]
    if not rows:
        return None
    mine = by_key.get("redis-async-sleep")
    mine_drain = mine.median(lambda r: r.drain) if mine else None
    table = Table(title="10 ms-sleep tasks: drain (medians; N per run as above)")
    for title in ("system", "drain tasks/s", "async prefork / it", "target", "met?"):
        table.add_column(title, justify="left" if title == "system" else "right")
    for o in sorted(rows, key=lambda o: -(o.median(lambda r: r.drain) or 0)):
        drain = o.median(lambda r: r.drain)
        ratio = f"{mine_drain / drain:.2f}x" if mine_drain and drain else "-"
        bound = SLEEP_TARGETS.get(o.system.key)
        target = f">= {bound:g}x" if bound else ""
        met = ("" if not bound or not (mine_drain and drain) else
               "[green]yes[/]" if mine_drain / drain >= bound else "[red]no[/]")
        table.add_row(o.system.name, cell([r.drain for r in o.runs], ",.0f"), ratio, target,
                      met)
    noop = by_key.get("redis")
    noop_drain = noop.median(lambda r: r.drain) if noop else None
    if mine_drain:
        wait_bound = SLEEP_IN_FLIGHT / bench_tasks.SLEEP_SECONDS
        if noop_drain and noop is not None and mine is not None:
            ceiling = min(wait_bound, noop_drain)
            # Run by run too: runs are interleaved, so run i of each saw the same machine.
            paired = [f"{m.drain / min(wait_bound, n.drain):.0%}"
                      for m, n in zip(mine.runs, noop.runs, strict=False) if m.drain and n.drain]
            table.caption = (
                f"ceiling with {SLEEP_IN_FLIGHT} in flight: min({wait_bound:,.0f}/s the wait "
                f"allows, {noop_drain:,.0f}/s the CPU allows = this run's no-op drain) = "
                f"{ceiling:,.0f}/s; the async sleep drain is {mine_drain / ceiling:.0%} of it "
                f"(run by run against that run's no-op drain: {', '.join(paired)})")
        else:
            table.caption = (f"{SLEEP_IN_FLIGHT} in flight allow {wait_bound:,.0f}/s; add "
                             "--systems redis for the CPU-bound ceiling (the no-op drain)")
    return table


Metric = Callable[[Run], float | None]
RatioRow = tuple[str, str, Metric, Metric, str]
"""(target key, label, celeriac's metric, the peer's metric, format)"""


def ratio_rows(outcomes: list[Outcome], opts: argparse.Namespace) -> list[RatioRow]:
    rows: list[RatioRow] = [
        ("enqueue", "enqueue delay() tasks/s", lambda r: r.enqueue, lambda r: r.enqueue,
         ",.0f"),
        ("bulk_vs_delay", "enqueue: celeriac bulk vs peer delay()", lambda r: r.best_bulk,
         lambda r: r.enqueue, ",.0f"),
        ("bulk", "enqueue: bulk vs bulk (best)", lambda r: r.best_bulk,
         lambda r: r.best_bulk, ",.0f"),
        ("drain", "drain tasks/s", lambda r: r.drain, lambda r: r.drain, ",.0f"),
        ("p50", "round trip p50 ms", lambda r: ms(r.p50), lambda r: ms(r.p50), ".2f"),
        ("p99", "round trip p99 ms", lambda r: ms(r.p99), lambda r: ms(r.p99), ".2f"),
    ]
    if show_canvas(outcomes, opts):
        # As rates (tasks / seconds to the last result), so that the ratio reads as the
        # other rows' do: higher is better, the target is a multiple of Celery's.
        def group_rate(r: Run) -> float | None:
            return opts.canvas_n / r.group if r.group else None

        def chord_rate(r: Run) -> float | None:
            return opts.chord_n / r.chord if r.chord else None

        rows += [
            ("group", f"group join {opts.canvas_n:,} tasks/s", group_rate, group_rate, ",.0f"),
            ("chord", f"chord {opts.chord_n:,} tasks/s", chord_rate, chord_rate, ",.0f"),
        ]
    return rows


def ratio_table(outcomes: list[Outcome], opts: argparse.Namespace) -> Table | None:
    by_key = {o.system.key: o for o in outcomes if o.runs}
    ours = by_key.get("redis") or by_key.get("redis-io")
    peers = [by_key.get(k) or by_key[f"{k}-io"] for k in PEERS
             if k in by_key or f"{k}-io" in by_key]
    if ours is None or not peers:
        return None
    rows = ratio_rows(outcomes, opts)
    table = Table(title="celeriac on Redis against its peers (medians; ratio = celeriac / "
                        "peer; for round trips lower is better)")
    table.add_column("metric")
    table.add_column("celeriac\nredis", justify="right")
    for p in peers:
        label = PEERS[p.system.key.removesuffix("-io")].label
        table.add_column(label, justify="right")
        table.add_column(f"celeriac/\n{label}", justify="right")
    table.add_column("target", justify="right")
    table.add_column("met?")
    variants = [("", "")]
    if "redis-io" in by_key:
        variants.append(("-io", " (I/O task)"))
    for suffix, title in variants:
        mine_o = by_key.get("redis" + suffix)
        if mine_o is None:
            continue
        for row in rows:
            if suffix and row[0] not in ("enqueue", "drain"):
                continue
            table.add_row(*ratio_row(row, title, suffix, mine_o, peers, by_key))
    table.caption = drain_check(by_key)
    table.caption_justify = "left"
    return table


def drain_check(by_key: dict[str, Outcome]) -> str:
    """Issue 30's drain and round-trip targets run by run: each of celeriac's runs
    against the same run of each peer (runs are interleaved: run i of every system saw
    the same machine), its spread about its median, and the machine's load."""
    lines = []
    for suffix in ("", "-io"):
        mine = by_key.get("redis" + suffix)
        if mine is None or not mine.runs:
            continue
        middle = mine.median(lambda r: r.drain) or 0.0
        spread = max(abs(r.drain / middle - 1) for r in mine.runs) if middle else 0.0
        ok = spread <= SPREAD_TARGET
        parts = [f"spread {spread:.0%} (<= {SPREAD_TARGET:.0%})"]
        for peer, times in {"celery": TARGETS["drain"][1], **PEER_DRAIN_TARGETS}.items():
            theirs = by_key.get(peer + suffix)
            if theirs is None:
                continue
            ratios = [a.drain / b.drain for a, b in zip(mine.runs, theirs.runs, strict=False)]
            ok = ok and bool(ratios) and min(ratios) >= times
            parts.append(f"/{PEERS[peer].label} " + ", ".join(f"{x:.2f}x" for x in ratios)
                         + f" (>= {times:g}x)")
        loads = ", ".join(f"{r.load:.1f}" for r in mine.runs if r.load is not None)
        lines.append(f"drain{' (I/O task)' if suffix else ''} run by run: "
                     f"{', '.join(f'{r.drain:,.0f}' for r in mine.runs)}/s; "
                     f"{'; '.join(parts)}; load {loads}: "
                     f"{'[green]met[/]' if ok else '[red]not met[/]'}")
    noop = by_key.get("redis")
    if noop is not None and any(r.p50 is not None for r in noop.runs):
        p50_max, p99_max = TARGETS["p50"][1], TARGETS["p99"][1]
        ok = all(r.p50 is not None and r.p99 is not None and r.p50 <= p50_max
                 and r.p99 <= p99_max for r in noop.runs)
        shown = ", ".join(f"{(r.p50 or 0) * 1e3:.2f}/{(r.p99 or 0) * 1e3:.2f}"
                          for r in noop.runs)
        lines.append(f"round trip p50/p99 ms run by run: {shown} (<= {p50_max * 1e3:g}/"
                     f"{p99_max * 1e3:g}): {'[green]met[/]' if ok else '[red]not met[/]'}")
    return "\n".join(lines)


def ratio_row(row: RatioRow, title: str, suffix: str, mine_o: Outcome, peers: list[Outcome],
              by_key: dict[str, Outcome]) -> list[str]:
    """One metric's cells: celeriac's, each peer's and the ratio, the target, met?"""
    key, label, metric, peer_metric, fmt = row
    mine = mine_o.median(metric)
    cells = [label + title, "-" if mine is None else format(mine, fmt)]
    others: dict[str, float | None] = {}
    for p in peers:
        peer = PEERS[p.system.key.removesuffix("-io")].key
        po = by_key.get(peer + suffix)
        theirs = po.median(peer_metric) if po else None
        others[peer] = theirs
        cells.append("-" if theirs is None else format(theirs, fmt))
        cells.append(f"{mine / theirs:.2f}x" if mine and theirs else "-")
    celery = by_key.get("celery" + suffix)
    return [*cells, *verdict(key, mine, celery, peer_metric, others, mine_o)]


def verdict(key: str, mine: float | None, celery: Outcome | None, peer_metric: Metric,
            others: dict[str, float | None], mine_o: Outcome) -> tuple[str, str]:
    """(target, met?) for one metric, from TARGETS (medians; ``drain_check`` judges
    the drain run by run)."""
    kind, bound = TARGETS.get(key, ("", 0.0))
    if kind == "ceiling":
        met = "" if mine is None else "[green]yes[/]" if mine / 1000 <= bound else "[red]no[/]"
        return f"<= {bound * 1000:g} ms", met
    if kind != "ratio":
        return "", ""
    target = f">= {bound:g}x Celery"
    theirs = celery.median(peer_metric) if celery else None
    ok = bool(mine and theirs and mine / theirs >= bound)
    if key == "drain":
        for peer, times in PEER_DRAIN_TARGETS.items():
            target += f", {times:g}x {PEERS[peer].label}"
            other = others.get(peer)
            ok = ok and bool(mine and other and mine / other >= times)
    if mine and theirs:
        return target, "[green]yes[/]" if ok else "[red]no[/]"
    if any(key in r.canvas_errors for o in (mine_o, celery) if o for r in o.runs):
        return target, "[red]failed[/]"  # the reason is printed under the table
    return target, ""


EVENTS_TARGET = 0.15
"""Task events on may slow the Redis drain by less than this share."""


def events_cost(outcomes: list[Outcome]) -> None:
    """The drain with task events on (``-E``) beside the drain without, from this run.

    The runs are interleaved, so run i with -E ran next to run i without: the share
    is the median of those pairs' shares, which drift on a shared machine moves less than
    it moves the medians of each side."""
    by_key = {o.system.key: o for o in outcomes if o.runs}
    off = by_key.get("redis")
    for key, who in (("redis-events", "nobody listening"),
                     ("redis-events-watched", "a monitor subscribed")):
        on = by_key.get(key)
        if off is None or on is None:
            continue
        shares = [1 - b.drain / a.drain for a, b in zip(off.runs, on.runs, strict=False)]
        slower = statistics.median(shares)
        verdict = "[green]yes[/]" if slower < EVENTS_TARGET else "[red]no[/]"
        console.print(f"task events, {who}: drain {on.median(lambda r: r.drain):,.0f}/s with "
                      f"-E against {off.median(lambda r: r.drain):,.0f}/s without (medians); "
                      f"run by run {', '.join(f'{x:+.1%}' for x in shares)} slower: median "
                      f"{slower:+.1%} (target < {EVENTS_TARGET:.0%}: {verdict})")


def pool_ratios(outcomes: list[Outcome]) -> None:
    """Prefork (2 children) drain over solo drain, per local transport, from this run."""
    drains = {o.system.name: o.median(lambda r: r.drain) for o in outcomes if o.runs}
    for transport in ("sqlite", "memory"):
        solo = drains.get(f"celeriac {transport} solo")
        prefork = drains.get(f"celeriac {transport} prefork x2")
        if solo and prefork:
            console.print(f"{transport}: prefork x2 drains {prefork / solo:.2f}x the solo pool")
