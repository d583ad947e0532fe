"""What a running task sees, wherever it runs (a worker's pool, eager ``apply``, a test):
the current app and ``@shared_task`` (``state``), the current request (``request``),
progress reports (``progress``), and what ``async def`` tasks need: time limits thrown
into a coroutine and a loop to run one on (``aio``).

Below the task class and the canvas, above nothing but the foundations: a module here
imports no service (worker, beat) and no client.
"""
