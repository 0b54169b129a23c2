"""rlcompare: matched comparisons of RL post-training algorithms for language models.

Kept import-free on purpose: `rlcompare.report` must load without torch.
"""

__version__ = "0.1.0"
