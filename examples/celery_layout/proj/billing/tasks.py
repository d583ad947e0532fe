import json

import redis

from celeriac import Task, shared_task
from proj import settings

_audit = None


def audit_log():
    global _audit
    if _audit is None:
        _audit = redis.Redis.from_url(settings.BILLING_AUDIT_URL)
    return _audit


class AuditedTask(Task):
    """Every billing task leaves a line in the audit trail, whatever its outcome."""

    def on_success(self, retval, task_id, args, kwargs):
        audit_log().hset(f"{settings.BILLING_AUDIT_PREFIX}:{task_id}", mapping={
            "task": self.name, "status": "ok", "result": json.dumps(retval)})

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        audit_log().hset(f"{settings.BILLING_AUDIT_PREFIX}:{task_id}", mapping={
            "task": self.name, "status": "failed", "error": repr(exc)})


class PaymentDeclined(Exception):
    pass


@shared_task(base=AuditedTask)
def charge(customer_id, amount_cents):
    if amount_cents <= 0:
        raise PaymentDeclined(f"invalid amount {amount_cents} for {customer_id}")
    return {"customer_id": customer_id, "charged": amount_cents}
