"""rollout.engine=vllm's refusals: each combination the engine cannot honour is refused by the schema, before torch
loads, naming the key and the fix. Config only: these run in the main suite too, with or without vllm."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from rlcompare.config import ConfigError, validate
from rlcompare.config import schema


@pytest.fixture
def vllm_present(monkeypatch):
    """find_spec as if vllm were installed (the refusals below are about the run's other settings)."""
    real = importlib.util.find_spec
    found = SimpleNamespace(origin="/site-packages/vllm/__init__.py")
    monkeypatch.setattr(schema.importlib.util, "find_spec", lambda n, *a: found if n == "vllm" else real(n, *a))


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_vllm_missing_is_refused_with_the_install_command(compose, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(schema.importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    with pytest.raises(ConfigError, match=r'rollout.engine=vllm: vllm is not installed; pip install -e "\.\[vllm\]"'):
        validate(compose("rollout.engine=vllm"))
    validate(compose("rollout.engine=eager"))  # the other engines never look for it


@pytest.mark.parametrize(
    "override, says",
    [
        ("env=calc", "env.name=calc: multi-turn episodes are not supported by this engine; set env=none"),
        ("rollout.top_p=0.9", "rollout.top_p=0.9: vLLM's log-probs would be over the nucleus"),
        ("+model.lora.enabled=true", "model.lora.enabled=true: the engine loads whole weights"),
        ("trainer.parallel=ddp", "trainer.parallel=ddp: one engine per process"),
        ("trainer.parallel=fsdp", "trainer.parallel=fsdp: one engine per process"),
    ],
)
def test_what_the_engine_cannot_honour_is_refused(compose, vllm_present, override, says):
    with pytest.raises(ConfigError, match="rollout.engine=vllm: " + says.replace(".", r"\.")) as e:
        validate(compose("rollout.engine=vllm", override))
    assert "rollout.engine=auto" in str(e.value)  # the way out that keeps the setting
    validate(compose("rollout.engine=eager", override))  # refused for vllm's sake only


def test_the_engine_is_accepted_with_what_it_honours(compose, vllm_present):
    c = validate(compose("rollout.engine=vllm", "rollout.streams=group", "eval.samples=2", "eval.top_p=0.9"))
    assert c.rollout.engine == "vllm"  # eval's nucleus reads no log-probs: vLLM samples it as asked
