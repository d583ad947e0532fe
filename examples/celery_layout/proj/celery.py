from celeriac import Celeriac

app = Celeriac("proj")

# Using a string here means the worker doesn't have to serialize
# the configuration object to child processes.
# - namespace='CELERY' means all celery-related configuration keys
#   should have a `CELERY_` prefix.
app.config_from_object("proj.settings", namespace="CELERY")

# Load task modules from the project's apps (Django: autodiscover_tasks()).
app.autodiscover_tasks(["proj.orders", "proj.billing"])


@app.task(bind=True, ignore_result=True)
def debug_task(self):
    print(f"Request: {self.request!r}")
