"""Celery's ``celery.contrib.testing``: ``worker.start_worker`` (a real worker in a thread
of the test process) and ``manager.Manager`` (the helpers of Celery's integration
tests), over ``celeriac.testing``."""
