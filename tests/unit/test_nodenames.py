"""Node-name formats (``-n``, ``--logfile``, ``--pidfile``) and the pid file lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from celeriac.cli.pidfile import Pidfile, alive, read_pid
from celeriac.utils import nodenames as nn


@pytest.fixture(autouse=True)
def host(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(nn, "gethostname", lambda: "box.example.com")
    return "box.example.com"


@pytest.mark.parametrize(("template", "expected"), [
    ("%h", "box.example.com"),
    ("%n", "box"),
    ("%d", "example.com"),
    ("%i", "0"),
    ("[%I]", "[]"),
    ("100%%-%n", "100%-box"),
    ("%%n", "%n"),
    ("plain", "plain"),
    ("", ""),
])
def test_host_format(template: str, expected: str) -> None:
    assert nn.host_format(template) == expected


def test_process_index_in_a_child() -> None:
    assert nn.host_format("%n%I.log", index=3) == "box-3.log"
    assert nn.host_format("%i", index=3) == "3"


def test_host_without_domain() -> None:
    assert nn.host_format("%n|%d|%h", host="solo") == "solo||solo"


@pytest.mark.parametrize(("template", "expected"), [
    ("%n.pid", "w1.pid"),
    ("%n%I.log", "w1.log"),
    ("%p", "w1@h1.dom.org"),
    ("%h/%d/%n", "h1.dom.org/dom.org/w1"),
    ("/var/run/celeriac/%n-%i.pid", "/var/run/celeriac/w1-0.pid"),
])
def test_node_format(template: str, expected: str) -> None:
    assert nn.node_format(template, "w1@h1.dom.org") == expected


def test_node_format_of_a_bare_host_uses_the_default_name() -> None:
    assert nn.node_format("%n|%h", "h1") == "celeriac|h1"


def test_unknown_key_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"^unknown format %z$"):
        nn.host_format("x%z")


@pytest.mark.parametrize(("value", "expected"), [
    (None, "celeriac@box.example.com"),
    ("", "celeriac@box.example.com"),
    ("w1@%h", "w1@box.example.com"),
    ("w1@%n", "w1@box"),
    ("w1@", "w1@box.example.com"),
    ("%h", "celeriac@box.example.com"),
    ("w1@other", "w1@other"),
    ("w1.%n@%d", "w1.box@example.com"),
])
def test_worker_hostname(value: str | None, expected: str) -> None:
    assert nn.worker_hostname(value) == expected


def test_nodesplit() -> None:
    assert nn.nodesplit("a@b@c") == ("a", "b@c")
    assert nn.nodesplit("host") == (None, "host")


# -- the pid file ----------------------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    return proc.pid


def test_pidfile_written_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "w.pid"
    lock = Pidfile(str(path))
    lock.check()
    lock.acquire()
    assert read_pid(path) == os.getpid()
    lock.release()
    assert not path.exists()


def test_live_pidfile_refuses(tmp_path: Path) -> None:
    path = tmp_path / "w.pid"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    try:
        path.write_text(f"{proc.pid}\n")
        with pytest.raises(click.ClickException, match=f"names running process {proc.pid}"):
            Pidfile(str(path)).check()
        assert path.exists()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


def test_stale_pidfile_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "w.pid"
    path.write_text(f"{_dead_pid()}\n")
    lock = Pidfile(str(path))
    lock.check()
    lock.acquire()
    assert read_pid(path) == os.getpid()
    lock.release()


def test_release_leaves_another_process_file(tmp_path: Path) -> None:
    path = tmp_path / "w.pid"
    lock = Pidfile(str(path))
    lock.acquire()
    path.write_text("1\n")  # e.g. a forked child, or a newer worker, now owns it
    lock.release()
    assert path.read_text() == "1\n"


def test_garbage_pidfile_is_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "w.pid"
    path.write_text("hello\n")
    with pytest.raises(click.ClickException, match="does not hold a pid"):
        Pidfile(str(path)).check()


def test_alive() -> None:
    assert alive(os.getpid())
    assert not alive(_dead_pid())
    assert not alive(0)
