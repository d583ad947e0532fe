"""celeriac on Amazon SQS, as ``make bench`` can run it: moto's server on a free loopback
port (with the two fixes of ``scripts/moto_sqs.py``: a plain clock, and receives under
the queue's lock), a worker subprocess, results in the bench's Redis database.

moto is a Python imitation of SQS in one process: its figure says what celeriac's SQS
transport costs on top of a slow broker, not what SQS itself does (each real SQS call
is a network round trip of milliseconds)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import tasks as bench_tasks
from celeriac_systems import CeleriacProcess
from harness import (
    CELERIAC_REDIS_DB,
    CELERIAC_REDIS_URL,
    BenchError,
    flush_redis_db,
    require_redis,
)

MOTO_MAIN = Path(__file__).resolve().parents[1] / "scripts" / "moto_sqs.py"
"""moto's server with the test suite's two fixes."""


class CeleriacSQS(CeleriacProcess):
    def __init__(self) -> None:
        super().__init__("sqs", "sqs", "prefork", 2)
        self.name = "celeriac sqs (moto) prefork x2"
        self.detail = ("broker: moto's SQS server (a local imitation); results on Redis db "
                       f"{CELERIAC_REDIS_DB}; worker: `celeriac -A tasks worker --pool prefork "
                       "-c 2 -l warning` subprocess")
        self.moto: subprocess.Popen[bytes] | None = None

    def _start_moto(self) -> str:
        try:
            import moto.server  # noqa: F401
        except ImportError as exc:
            raise BenchError(f"the sqs row needs moto[server] ({exc}): make dev") from exc
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.moto = subprocess.Popen([sys.executable, str(MOTO_MAIN), "-H", "127.0.0.1",
                                      "-p", str(port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if self.moto.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"moto's server did not start on port {port}") from None
                time.sleep(0.05)  # sleep-ok: polling the port under the deadline
        return f"http://127.0.0.1:{port}"

    def setup(self, workdir: Path) -> None:
        self.workdir = workdir
        require_redis()
        flush_redis_db(CELERIAC_REDIS_DB)
        endpoint = self._start_moto()
        self.broker_url = f"sqs://bench:bench@?endpoint_url={endpoint}&namespace=bench"
        self.worker_env = {"CELERIAC_RESULT_BACKEND": CELERIAC_REDIS_URL}
        saved = {k: os.environ.get(k) for k in ("CELERIAC_BROKER_URL",
                                                "CELERIAC_RESULT_BACKEND")}
        os.environ.update(CELERIAC_BROKER_URL=self.broker_url,
                          CELERIAC_RESULT_BACKEND=CELERIAC_REDIS_URL)
        try:
            self.app, self.noop = bench_tasks.make_app()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        self.app.transport.ping()
        self.app.backend.get("warm-up")

    def url(self, workdir: Path) -> str:
        return self.broker_url

    def teardown(self) -> None:
        super().teardown()
        flush_redis_db(CELERIAC_REDIS_DB)
        moto, self.moto = self.moto, None
        if moto is not None:
            moto.terminate()
            moto.wait(10)
