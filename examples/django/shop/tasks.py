"""The shop's tasks: ``@shared_task``, so they belong to whichever app the project made
(``proj.celery.app``)."""

from django.utils import timezone

from celeriac import shared_task

from .models import Order, Tick


@shared_task
def process_order(order_id: int) -> str:
    # The view sends this on commit: the row is always there when the worker looks.
    order = Order.objects.get(pk=order_id)
    order.processed_at = timezone.now()
    order.save(update_fields=["processed_at"])
    return f"processed {order.item}"


@shared_task
def tick(label: str) -> int:
    Tick.objects.create(label=label)
    return Tick.objects.filter(label=label).count()
