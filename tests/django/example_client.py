"""What a user does to the example project (``examples/django``), run as a process of
its own with the project's settings (Django's settings are one per process): place an
order through the view, schedule and edit a periodic task as the admin does (model
saves, so django-celery-beat's signals mark the change), read a result back.

``python tests/django/example_client.py <command> [args...] [-- <command> ...]``: runs
the commands in order (one process: Django starts once), prints their answers as one
JSON list.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any


def order(item: str, fail: str = "") -> dict[str, Any]:
    from django.test import Client

    response = Client().post("/orders/", {"item": item, **({"fail": "1"} if fail else {})})
    return {"status": response.status_code, "body": json.loads(response.content)}


def schedule(name: str, label: str, every: str) -> dict[str, Any]:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    interval, _ = IntervalSchedule.objects.get_or_create(every=int(every),
                                                         period=IntervalSchedule.SECONDS)
    task = PeriodicTask.objects.create(name=name, task="shop.tasks.tick", interval=interval,
                                       args=json.dumps([label]))
    return {"id": task.pk}


def edit(name: str, label: str) -> dict[str, Any]:
    from django_celery_beat.models import PeriodicTask

    task = PeriodicTask.objects.get(name=name)
    task.args = json.dumps([label])
    task.save()
    return {"id": task.pk}


def once(name: str, label: str, seconds: str) -> dict[str, Any]:
    """A one-off task at a clocked time ``seconds`` from now."""
    from django.utils import timezone
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    clocked = ClockedSchedule.objects.create(
        clocked_time=timezone.now() + timedelta(seconds=float(seconds)))
    task = PeriodicTask.objects.create(name=name, task="shop.tasks.tick", clocked=clocked,
                                       one_off=True, args=json.dumps([label]))
    return {"id": task.pk}


def result(task_name: str) -> dict[str, Any]:
    """The result of the one task ``task_name`` sent, read through ``AsyncResult`` (the
    ``django-db`` backend) once its row appears."""
    from django_celery_results.models import TaskResult
    from proj.celery import app

    from celeriac.testing import wait_until

    row = wait_until(lambda: TaskResult.objects.filter(task_name=task_name).first(), 30,
                     0.05, message=f"a result row for {task_name}")
    got = app.AsyncResult(row.task_id)
    return {"task_id": row.task_id, "result": got.get(timeout=30), "state": got.state}


COMMANDS = {"order": order, "schedule": schedule, "edit": edit, "once": once,
            "result": result}

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    import django

    django.setup()
    answers, args = [], sys.argv[1:]
    while args:
        cut = args.index("--") if "--" in args else len(args)
        answers.append(COMMANDS[args[0]](*args[1:cut]))
        args = args[cut + 1:]
    print(json.dumps(answers))
