"""On-policy distillation wired through the trainer (issue 52): the teacher's log-probs of the sampled tokens minus
the sampler's are the advantages (checked against a plain transformers forward of the teacher, computed here), a
teacher equal to the student gives no distillation gradient (OPD + reward then trains as the reward alone), a run
folder serves as a teacher, and bad settings are refused before the run folder exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlcompare.config import ConfigError, validate
from rlcompare.train.export import export_policy
from rlcompare.train.precheck import check_job
from rlcompare.train.trainer import Trainer
from tests.conftest import FAST, record_step_gradients


WARM = "model.warm_start.steps=300"  # the shipped warm start: groups whose rewards differ from the first batch


def _trainer(compose, run_dir: Path, *overrides) -> Trainer:
    cfg = validate(compose(WARM, *overrides))
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return Trainer(cfg, run_dir)


@pytest.fixture
def student_copy(compose, tmp_path) -> Path:
    """The student's initial weights exported as a Hugging Face folder: a teacher identical to the student."""
    tr = _trainer(compose, tmp_path / "student")
    return export_policy(tr.policy, tr.cfg, tmp_path / "student_copy")


@pytest.fixture
def other_teacher(compose, tmp_path) -> Path:
    """The student after a few steps at a large learning rate: the same tokenizer, other weights."""
    tr = _trainer(compose, tmp_path / "teacher_run", "trainer.lr=3e-2", "seed=5")
    for _ in range(2):
        tr.step()
    return export_policy(tr.policy, tr.cfg, tmp_path / "other_teacher")


def _teacher_logp_by_hand(folder: Path, batch, temperature: float) -> torch.Tensor:
    """log pi_T(y_t) from one plain forward of prompt + completion per row (no grouping, no chunks)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    c = batch.completions
    ids = torch.cat([batch.prompt_ids, c.ids], dim=1)
    attn = torch.cat([batch.prompt_mask, c.mask], dim=1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()
    P = batch.prompt_ids.shape[1]
    logp = (logits[:, P - 1 : -1] / temperature).log_softmax(-1)
    return logp.gather(-1, c.ids[..., None])[..., 0]


def test_the_advantage_is_the_teachers_log_prob_minus_the_samplers(compose, tmp_path, other_teacher):
    tr = _trainer(compose, tmp_path / "run", "algorithm=opd", f"teacher.path={other_teacher}")
    collected = tr.collect()
    batch = collected.batch
    targets = tr.targets.advantages(batch)
    mask = batch.completions.mask.bool()
    expected = _teacher_logp_by_hand(other_teacher, batch, tr.cfg.rollout.temperature) - batch.completions.logp
    torch.testing.assert_close(targets.advantages[mask], expected[mask], atol=1e-4, rtol=1e-4)
    assert float(targets.advantages[~mask].abs().max()) == 0.0
    assert float(targets.advantages[mask].abs().max()) > 1e-2  # another teacher: a signal, not rounding
    m = targets.metrics
    assert m["distill/teacher_nonfinite"] == 0 and m["distill/reward_term_abs_per_token"] == 0.0
    assert m["distill/reverse_kl"] == pytest.approx(-float(expected[mask].mean()), abs=1e-4)
    assert m["distill/distill_term_abs_per_token"] == pytest.approx(float(expected[mask].abs().mean()), abs=1e-4)
    assert m["time/teacher_s"] > 0 and m["perf/teacher_tokens_per_s"] > 0


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_teacher_equal_to_the_student_adds_no_gradient(compose, tmp_path, student_copy):
    """OPD + reward (coef 1) with the student as its own teacher trains as the reward's group advantage alone:
    the distillation term is the sampler's rounding (< 1e-5) and the first step's gradients are the reward's."""
    common = ("algorithm=opd", "algorithm.advantage.reward_coef=1.0")
    opd = _trainer(compose, tmp_path / "opd", *common, f"teacher.path={student_copy}")
    reward_only = _trainer(
        compose, tmp_path / "reward", *common, "algorithm.advantage.estimator=group", "algorithm.name=opd"
    )
    grads = [record_step_gradients(t) for t in (opd, reward_only)]
    row = opd.step()
    reward_only.step()
    assert row["distill/distill_term_abs_per_token"] < 1e-5 and row["distill/distill_term_abs_per_response"] < 1e-5
    assert row["distill/reward_term_abs_per_token"] > 0.1
    for g_opd, g_reward in zip(grads[0][0], grads[1][0]):
        torch.testing.assert_close(g_opd, g_reward, atol=1e-5, rtol=1e-3)


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_run_folder_is_a_teacher(compose, tmp_path):
    from rlcompare.train.run import train

    done = train(compose(WARM))  # a completed run checkpoints its last step
    run_dir = Path(done["run_dir"]) if "run_dir" in done else next((tmp_path / "results").glob("*/*"))
    tr = _trainer(compose, tmp_path / "opd_run", "algorithm=opd", f"teacher.path={run_dir}")
    assert tr.teacher is not None and not any(p.requires_grad for p in tr.teacher.model.parameters())
    row = tr.step()
    assert row["distill/distill_term_abs_per_token"] > 0 and row["distill/teacher_nonfinite"] == 0


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["algorithm=opd"], "set teacher.path="),
        (["algorithm=grpo", "teacher.path=/nonexistent"], "reads no teacher"),
        (["algorithm=opd", "teacher.path=x", "algorithm.kl.coef=0.1", "algorithm.kl.placement=in_reward"], "in_loss"),
        (["algorithm=opd", "teacher.path=x", "algorithm.advantage.distill_discount=1.5"], "distill_discount"),
        (["algorithm=opd", "teacher.path=x", "teacher.dtype=int8"], "teacher.dtype"),
    ],
)
def test_bad_distillation_settings_are_refused(compose, overrides, says):
    with pytest.raises(ConfigError, match=says):
        validate(compose(*overrides))


def _bad_teachers(root: Path, student_copy: Path) -> dict[str, Path]:
    import shutil

    out = {}
    for name in ("pickle", "code", "auto_map", "vocab"):
        folder = root / name
        shutil.copytree(student_copy, folder)
        out[name] = folder
    (out["pickle"] / "pytorch_model.bin").write_bytes(b"not read")
    (out["code"] / "modeling_x.py").write_text("raise SystemExit\n")
    conf = json.loads((out["auto_map"] / "config.json").read_text())
    conf["auto_map"] = {"AutoModelForCausalLM": "modeling_x.X"}
    (out["auto_map"] / "config.json").write_text(json.dumps(conf))
    tok_file = out["vocab"] / "tokenizer.json"
    tok = json.loads(tok_file.read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two ids swapped: the same size, another tokenizer
    tok_file.write_text(json.dumps(tok))
    return out


@pytest.mark.parametrize(
    "kind, says",
    [("pickle", "pickle files"), ("code", "code"), ("auto_map", "auto_map"), ("vocab", "different tokenizers")],
)
def test_bad_teachers_are_refused_before_the_run_folder_exists(tmp_path, student_copy, kind, says):
    teacher = _bad_teachers(tmp_path / "bad", student_copy)[kind]
    results = tmp_path / "cli_results"
    overrides = [*FAST, WARM, f"results_dir={results}", "algorithm=opd", f"teacher.path={teacher}"]
    err = check_job(overrides)
    assert err is not None and says in err and "\n" not in err, err
    assert not results.exists()


@pytest.mark.slow  # over ~1.5 s on 2 idle cores: out of the quick subset (issue 63), in CI's whole suite
def test_a_teacher_on_another_device_is_refused(compose, student_copy):
    from rlcompare.train.teacher_check import check_teacher

    cfg = validate(compose(WARM, "algorithm=opd", f"teacher.path={student_copy}", "device=cpu", "teacher.device=cuda"))
    with pytest.raises(ConfigError, match="not the policy's device"):
        check_teacher(cfg)


def test_a_teacher_on_another_device_than_device_auto_is_refused_before_the_run_folder(compose, tmp_path, student_copy):
    """device=auto resolves to cpu on this CUDA-less machine: teacher.device=cuda is refused by the run's
    preflight (the torch-free command-line check leaves auto to it), one line, before the run folder is made."""
    from rlcompare.train.run import train

    results = tmp_path / "results"
    overrides = [WARM, f"results_dir={results}", "logger=none", "algorithm=opd", f"teacher.path={student_copy}"]
    with pytest.raises(ConfigError, match="teacher.device='cuda' is not the policy's device 'cpu'") as e:
        train(compose(*overrides, "device=auto", "teacher.device=cuda"))
    assert "\n" not in str(e.value)
    assert not any(p.is_dir() for p in results.rglob("*") if p.name.startswith("opd")), list(results.rglob("*"))
