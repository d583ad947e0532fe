from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    processed_at = models.DateTimeField(null=True)


class Tick(models.Model):
    """One run of the periodic task ``shop.tasks.tick`` (scheduled in the admin)."""

    label = models.CharField(max_length=100)
    at = models.DateTimeField(auto_now_add=True)
