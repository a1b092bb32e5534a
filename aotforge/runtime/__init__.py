"""The serving runtime: requests, the iteration-level scheduler, the KV block manager, sampling and
detokenization, over one model runner per target. ``generate()`` and the server are its clients."""
