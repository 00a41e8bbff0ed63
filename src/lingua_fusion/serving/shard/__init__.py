"""Streams sharded over worker processes, one model process for all of them (``linguafusion serve --workers N``):
``codec.py`` (the wire), ``remote.py`` (the workers' ModelPort), ``model_process.py`` (the one executor),
``metrics.py`` (/metrics summed over the processes). The supervisor is api/workers.py."""
