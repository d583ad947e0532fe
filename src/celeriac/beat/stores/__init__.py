"""One module per store: ``memory``, ``redis``, ``postgres``, ``sqlite``."""
