"""How celeriac reaches a service: what every client shares (``net``: reconnect backoff,
the retry policy, URLs fit to print), URL schemes to classes (``schemes``: one registry
for transports, result backends and shared stores), and the client layers that
transports, backends and stores are built on: Redis (``redis``: one connection per role,
Cluster, Sentinel, Lua scripts) and SQLite (``sqlite``).

Nothing is imported here: a producer on PostgreSQL never loads the Redis client.
"""
