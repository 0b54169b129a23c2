"""The pure math: advantages, policy and value losses, batch statistics; the accepted names (torch-free).

Imports torch and nothing else of rlcompare but `algos.accepted` (docs/internals.md, tests/test_layers.py).
Kept import-free: config imports `rlcompare.algos.accepted` before torch loads.
"""
