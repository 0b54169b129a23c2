"""Prompt sets and their types: `Example` / `PromptSplits` (`types.py`), the embedded arithmetic set and the
order over it (`prompts.py`), file / hub / Countdown sets (`datasets.py`). The check that the verifier reads the
set's references is `rlcompare.train.verifier_probe`. Never imports torch."""
