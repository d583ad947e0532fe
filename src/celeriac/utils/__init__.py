"""Celery's ``celery.utils`` import paths that applications use, under celeriac's name:
``log`` (``get_task_logger``), ``nodenames`` (``anon_nodename``...) and ``serialization``
(``UnpickleableExceptionWrapper``). Each is a thin module over where celeriac keeps the
thing; ``celery.utils``' other helpers are Celery's internals and are not provided."""
