"""Prompt sets and their types: `Example` / `PromptSplits` (`types.py`), the embedded arithmetic set and the
order over it (`prompts.py`), file / hub / Countdown sets (`datasets.py`), and the check that the verifier reads
the set's references (`verifier_probe.py`). Never imports torch."""
