"""Celery's and kombu's formats, in one place: what lets celeriac share brokers, result
stores, remote control and monitoring with Celery 5.7 (compatibility mode).

The message protocol (v2 headers, ``[args, kwargs, embed]`` bodies) is the same
everywhere and lives in ``protocol.py``; what differs is where messages, results,
commands and events are kept. Everything here is chosen by a URL, never imported by
the core: the scheme registries (``transports/base.TRANSPORTS``,
``backends/base.BACKENDS``; ``clients/schemes.py``) name these classes for a URL's
``?layout=kombu`` or ``?layout=celery`` and for Celery's ``db+postgresql://`` URL, lazy
(module, class) entries as every scheme's. The one
other seam is ``pidbox.reply_exchange_for``, which ``app.control`` and ``Mingle`` ask
which reply exchange a command names.

============================ ==============================================================
module                       what it holds
============================ ==============================================================
``kombu_wire.py``            kombu's Redis layout: key names (``Keys``), priority steps, the
                             envelope, delivery counts, ``Exchange``, the fetch/move scripts
``redis_broker.py``          ``KombuRedisTransport`` (``redis://...?layout=kombu``): kombu's
                             lists and ``unacked`` hash, leases as its visibility timeout
``redis_pubsub.py``          ``RedisExchanges``: kombu's exchanges on Redis (fanout/topic
                             PUBLISH and (P)SUBSCRIBE; direct through ``_kombu.binding.*``)
``sqs_broker.py``            ``KombuSQSTransport`` (``sqs://...?layout=kombu``): kombu's
                             SQS bodies (base64 of its envelope), Celery's ``eta`` header
``amqp_broker.py``           ``KombuAMQPTransport`` (``amqp://...?layout=kombu``) and
                             ``AMQPExchanges``: Celery's exchanges declared as Celery does
``channels.py``              ``CeleryChannels``: a kombu-layout transport's events, control
                             and reply channels on Celery's exchanges; ``KombuExchanges``
``pidbox.py``                Celery's remote-control mailbox: exchanges, headers, reply queue
``events.py``                Celery's ``celeryev`` framing (an object per event, an array as
                             ``<group>.multi``)
``redis_results.py``         ``CeleryRedisBackend`` (``redis://...?layout=celery``):
                             ``celery-task-meta-<id>`` keys, Celery's chord counters
``db_results.py``            ``CeleryDatabaseBackend`` (``db+postgresql://``): Celery's
                             ``celery_taskmeta`` / ``celery_tasksetmeta`` tables
``db_results_mysql.py``      ``CeleryMySQLBackend`` (``db+mysql://``): the same tables on
                             MySQL/MariaDB
============================ ==============================================================

Imports run one way: the brokers and backends use ``kombu_wire``, ``channels``,
``pidbox`` and ``events``. Two of Celery's formats live with what reads them:
Celery's setting names are celeriac's own (``settings/celery_names.py``: a Celery
configuration ports unchanged, in or out of compatibility mode), and Celery's
``celery.chord_unlock`` task is one of the canvas's tasks (``canvas/builtins.py``).
``tests/compat/`` runs all of it against a real Celery 5.7.
"""
