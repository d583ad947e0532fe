"""The quickstart's tasks: what a user writes."""

from celeriac import Celeriac

app = Celeriac("quickstart")  # embedded default: sqlite:///celeriac.db, broker and results


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task(bind=True, max_retries=3, default_retry_delay=1, acks_late=True)
def flaky(self, n: int) -> int:  # type: ignore[no-untyped-def]
    if self.request.retries < 2:
        raise self.retry(countdown=0.5)
    return n
