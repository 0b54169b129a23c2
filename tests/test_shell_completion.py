"""Shell completion of `rlcompare train` (issue 63): the script Hydra prints for `rlcompare -sc install=bash` (or
`rlcompare train -sc install=bash`) is evaluated in bash, and its completion function, called as bash calls it on
<TAB>, completes the command word and train's overrides (it calls back `rlcompare -sc query=bash`, once an unknown
command)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RLCOMPARE = shutil.which("rlcompare") or str(Path(sys.executable).parent / "rlcompare")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or not Path(RLCOMPARE).exists(), reason="needs bash")


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env["PATH"] = str(Path(RLCOMPARE).parent) + os.pathsep + env["PATH"]
    return env


def _complete(install: str, line: str) -> list[str]:
    """COMPREPLY for `line` (the cursor at its end), in a bash that evaluated `install`'s script."""
    script = f"""
eval "$({install})"
COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; COMP_WORDS=($COMP_LINE)
[[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
hydra_bash_completion
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.slow  # over ~2.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_bash_completes_the_command_and_trains_overrides():
    assert _complete("rlcompare -sc install=bash", "rlcompare tr") == ["train"]
    dapo = _complete("rlcompare -sc install=bash", "rlcompare train algorithm=da")
    assert dapo == ["algorithm=dapo"]  # the preset in conf/algorithm/, through Hydra's own completion
    knob = _complete("rlcompare train -sc install=bash", "rlcompare train seed=1 algorithm.clip.eps_hi")
    assert knob == ["algorithm.clip.eps_high="]


def test_the_script_registers_rlcompare_itself():
    out = subprocess.run(
        [RLCOMPARE, "train", "-sc", "install=bash"], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("-F hydra_bash_completion rlcompare")
