"""The Redis client layer that the Redis transport and the Redis result backend share:

- ``connector``: URLs (``?namespace=``, masked passwords), failover, per-process and
  per-event-loop clients, retries, and loading the Lua scripts;
- ``lanes``: lean RESP connections for the hot scripts (hiredis packs and parses, one
  socket, redis-py's exception types);
- ``lua/``: the broker's scripts; ``lua/common.lua`` holds the key layout and is put in
  front of every script.
"""

from .connector import Connector, Endpoint, script_source

__all__ = ["Connector", "Endpoint", "script_source"]
