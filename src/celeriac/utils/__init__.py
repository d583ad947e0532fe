"""Celery's ``celery.utils`` import paths that applications use, under celeriac's name:
``log`` (``get_task_logger``), ``nodenames`` (``anon_nodename``, and the node names the
command line expands) and ``serialization`` (``UnpickleableExceptionWrapper``). ``log``
and ``serialization`` are thin modules over where celeriac keeps the thing;
``celery.utils``' other helpers are Celery's internals and are not provided."""
