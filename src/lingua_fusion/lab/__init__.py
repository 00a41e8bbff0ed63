"""The proof tools, apart from the product: the load generator (loadgen/), quality and latency evaluation
(eval/), chaos experiments and degradations (chaos/), the file benchmark (benchfile.py), and the fixtures they
share (fixtures.py).

The product never imports this package; only ``cli/lab.py`` (inside its command functions) and ``cli/stream.py``
(latency summary) do, lazily. Within the package, the shared material lives in ``fixtures.py``, which imports
nothing from the rest of lab/, so the subpackages never need each other for it.
"""
