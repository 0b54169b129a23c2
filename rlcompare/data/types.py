"""The types of a prompt set: `Example` and `PromptSplits`.

Moved here from `prompts.py` (still importable from there): `prompts.build_prompts` calls `datasets.build`, and
`datasets` builds these types, so they sit below both (that was the cycle prompts <-> datasets).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Example:
    prompt: str  # text given to the model (template applied; chat template applied later by the tokenizer side)
    answer: str  # reference the verifier compares against
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass
class PromptSplits:
    train: list[Example]
    eval: list[Example]
    chat: bool = False
    system_prompt: str | None = None

    def eval_hash(self) -> str:
        h = hashlib.sha256()
        for ex in self.eval:
            h.update(json.dumps([ex.prompt, ex.answer]).encode())
        return h.hexdigest()[:16]
