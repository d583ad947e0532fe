"""The Redis client layer that the Redis transport and the Redis result backend share:

- ``topology``: URLs (``?namespace=``, masked passwords; Sentinel and Cluster forms) and
  asking the sentinels for the master;
- ``connector``: failover, per-process and per-event-loop clients, retries;
- ``scripts``: loading the Lua scripts;
- ``lanes``: lean RESP connections for the hot scripts (hiredis packs and parses, one
  socket, redis-py's exception types);
- ``lua/``: the broker's scripts; ``lua/common.lua`` holds the key layout and is put in
  front of every script.
"""

from .connector import Connector
from .scripts import script_source
from .topology import Endpoint

__all__ = ["Connector", "Endpoint", "script_source"]
