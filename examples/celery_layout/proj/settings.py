"""Django-style settings: Celery's are the ones prefixed CELERY_, the rest is Django's."""

import os

DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
SECRET_KEY = "not-a-secret-example-only"
ALLOWED_HOSTS = ["localhost"]
INSTALLED_APPS = ["proj.orders", "proj.billing"]
TIME_ZONE = "UTC"

# Where the billing app keeps its audit trail (read by proj.billing, not by Celery).
BILLING_AUDIT_URL = os.environ.get("BILLING_AUDIT_URL", "redis://localhost:6379/2")
BILLING_AUDIT_PREFIX = os.environ.get("BILLING_AUDIT_PREFIX", "billing:audit")

# Celery Configuration Options
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://localhost:6379/0")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", "redis://localhost:6379/1")
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TIMEZONE = TIME_ZONE
CELERY_TASK_ROUTES = {"proj.billing.tasks.*": {"queue": "billing"}}
CELERY_TASK_ANNOTATIONS = {"proj.orders.tasks.slow": {"rate_limit": "50/s"}}
CELERY_WORKER_PREFETCH_MULTIPLIER = os.environ.get("CELERY_WORKER_PREFETCH_MULTIPLIER", "1")
CELERY_RESULT_EXTENDED = True
