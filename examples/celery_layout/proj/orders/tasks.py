import logging

from celeriac import shared_task

logger = logging.getLogger(__name__)


@shared_task
def add(x, y):
    return x + y


@shared_task(bind=True)
def send_confirmation(self, order_id, email):
    # A real project would send an email here; the receipt names the task that did it.
    logger.info("confirmation for order %s to %s", order_id, email)
    return {
        "order_id": order_id,
        "email": email,
        "task_id": self.request.id,
        "parent_id": self.request.parent_id,
    }


@shared_task
def place_order(order_id, email, items):
    total = sum(item["qty"] * item["price"] for item in items)
    confirmation = send_confirmation.delay(order_id, email)
    return {"order_id": order_id, "total": total, "confirmation_id": confirmation.id}


@shared_task
def slow(n):
    # Rate limited to 50/s by CELERY_TASK_ANNOTATIONS.
    return n * 2
