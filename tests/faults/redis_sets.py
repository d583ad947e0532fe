"""Redis deployments a test starts for itself on loopback ports: a Sentinel set (a master,
a replica, three sentinels) and a Cluster (three masters). Like ``own_redis`` in
``test_broker_faults.py``: never the shared Redis; no persistence (``--save ""
--appendonly no``), files in the test's tmp dir, every process killed after.

Every wait polls with a deadline (``celeriac.testing.wait_until``).
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from celeriac.testing import wait_until
from tests.services import IN_CI, reachable

HOST = "127.0.0.1"


def executable(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed")
        pytest.skip(f"{name} is not installed")
    return exe


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports free right now (held open together, so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_cluster_ports(n: int) -> list[int]:
    """``n`` ports that are free with their cluster bus port (+10000, so below 55536)."""
    found: list[int] = []
    for port in random.sample(range(20000, 30000), 200):
        if len(found) == n:
            break
        socks = [socket.socket() for _ in range(2)]
        try:
            socks[0].bind((HOST, port))
            socks[1].bind((HOST, port + 10000))
            found.append(port)
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    assert len(found) == n, "no free ports for a cluster"
    return found


@dataclass
class Procs:
    tmp: Path
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, port: int, *extra: str, sentinel: bool = False) -> None:
        """A redis-server (or a sentinel) on ``port``; waits until it accepts connections."""
        work = self.tmp / str(port)
        work.mkdir(exist_ok=True)
        if sentinel:
            conf = work / "sentinel.conf"  # a sentinel rewrites its config: it needs a file
            conf.write_text("".join(f"{line}\n" for line in extra))
            argv = [executable("redis-server"), str(conf), "--sentinel", "--port", str(port),
                    "--bind", HOST, "--dir", str(work)]
        else:
            argv = [executable("redis-server"), "--port", str(port), "--bind", HOST,
                    "--dir", str(work), "--save", "", "--appendonly", "no", *extra]
        log = (work / "log").open("ab")
        self.procs[port] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(lambda: reachable(HOST, port), 10, message=f"redis on {port} up")

    def kill(self, port: int) -> None:
        """``kill -9``: no goodbye, no last replication."""
        proc = self.procs[port]
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


@dataclass
class SentinelSet:
    master: int
    replica: int
    sentinels: list[int]
    procs: Procs

    def url(self, namespace: str, **query: str) -> str:
        """The ``redis+sentinel://`` URL of this set."""
        hosts = ";".join(f"{HOST}:{p}" for p in self.sentinels)
        extra = "".join(f"&{k}={v}" for k, v in query.items())
        return f"redis+sentinel://{hosts}/0?master=mymaster&namespace={namespace}{extra}"

    def current_master(self) -> int:
        client = redis.Redis(HOST, self.sentinels[0], socket_timeout=2)
        try:
            _, port = client.execute_command("SENTINEL", "get-master-addr-by-name", "mymaster")
        finally:
            client.close()
        return int(port)


@contextmanager
def sentinel_set(tmp: Path) -> Iterator[SentinelSet]:
    """A master, one replica and three sentinels (quorum 2), ready to fail over."""
    procs = Procs(tmp)
    master, replica, *sentinels = free_ports(5)
    try:
        # No 5 s pause before the first full sync (repl-diskless-sync-delay's default).
        procs.start(master, "--repl-diskless-sync-delay", "0")
        procs.start(replica, "--replicaof", HOST, str(master))
        monitor = [f"sentinel monitor mymaster {HOST} {master} 2",
                   "sentinel down-after-milliseconds mymaster 600",
                   "sentinel failover-timeout mymaster 4000",
                   "sentinel parallel-syncs mymaster 1"]
        for port in sentinels:
            procs.start(port, *monitor, sentinel=True)
        s = SentinelSet(master, replica, sentinels, procs)

        def in_sync() -> bool:
            c = redis.Redis(HOST, replica, socket_timeout=2, decode_responses=True)
            try:
                return bool(c.info("replication").get("master_link_status") == "up")
            finally:
                c.close()

        wait_until(in_sync, 20, interval=0.05, message="the replica in sync with the master")

        def ready() -> bool:
            # Every sentinel knows the replica (in sync) and the two other sentinels: a
            # failover needs a majority of them to elect a leader.
            for port in sentinels:
                c = redis.Redis(HOST, port, socket_timeout=2, decode_responses=True)
                try:
                    replicas = c.execute_command("SENTINEL", "replicas", "mymaster")
                    peers = c.execute_command("SENTINEL", "sentinels", "mymaster")
                finally:
                    c.close()
                if len(peers) < 2 or not replicas:
                    return False
                info = replicas[0]
                flags = info[info.index("flags") + 1] if isinstance(info, list) else ""
                if "s_down" in flags or "disconnected" in flags:
                    return False
            return True

        wait_until(ready, 20, interval=0.2, message="sentinels see the replica and each other")
        yield s
    finally:
        procs.stop_all()


@dataclass
class Cluster:
    ports: list[int]
    procs: Procs

    def url(self, namespace: str) -> str:
        hosts = ";".join(f"{HOST}:{p}" for p in self.ports)
        return f"redis+cluster://{hosts}/0?namespace={namespace}"


@contextmanager
def cluster(tmp: Path, masters: int = 3) -> Iterator[Cluster]:
    """A Redis Cluster of ``masters`` masters and no replicas, all slots covered."""
    procs = Procs(tmp)
    ports = free_cluster_ports(masters)
    try:
        for port in ports:
            procs.start(port, "--cluster-enabled", "yes", "--cluster-config-file",
                        str(tmp / f"nodes-{port}.conf"), "--cluster-node-timeout", "2000")
        subprocess.run([executable("redis-cli"), "--cluster", "create",
                        *(f"{HOST}:{p}" for p in ports), "--cluster-yes"],
                       check=True, capture_output=True, timeout=30)

        def ok() -> bool:
            for port in ports:
                c = redis.Redis(HOST, port, socket_timeout=2, decode_responses=True)
                try:
                    info = c.execute_command("CLUSTER", "INFO")
                finally:
                    c.close()
                if "cluster_state:ok" not in str(info):
                    return False
            return True

        wait_until(ok, 20, interval=0.1, message="cluster_state:ok on every node")
        yield Cluster(ports, procs)
    finally:
        procs.stop_all()
