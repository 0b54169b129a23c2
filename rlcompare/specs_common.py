"""What every extension point's declaration shares (surrogates, advantage estimators, verifiers, environments):
:func:`knob`, a settings dataclass field that is a config key, with its default and its one-line help. Standard
library only: the config check reads the declarations before torch loads."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def knob(default: Any, help: str, *, signed: bool = False) -> Any:
    """A settings field that is a config key (``algorithm.clip.<name>``, ``algorithm.advantage.<name>``,
    ``verifier.<name>``, ...): its default and its one-line help (shown in docs/config.md). ``signed=True``:
    negative values are the knob's own business (its ``check``); otherwise the schema refuses them as it refuses
    every negative number."""
    return field(default=default, metadata={"help": help, "signed": signed})
