"""Provenance (issue 42): every run records where it was computed; the report warns when compared runs differ."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from rlcompare.train import provenance as P
from rlcompare.train.run import train

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "report"))


def test_the_checkout_commit_and_library_versions_are_recorded():
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    rec = P.collect("cpu", 3, "single")
    assert rec["code"]["commit"] == head.stdout.strip() and isinstance(rec["code"]["dirty"], bool)
    assert rec["libraries"]["torch"] == torch.__version__
    assert rec["libraries"]["transformers"] and rec["python"] == ".".join(map(str, sys.version_info[:3]))
    assert rec["device"] == "cpu" and rec["threads"] == 3 and rec["launcher"] == "single"
    assert rec["cpu_cores"] >= 1 and "device_model" in rec


def test_outside_a_checkout_the_installed_version_stands_in(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "PACKAGE_DIR", tmp_path)  # no .git here
    code = P.code_version()
    assert code["commit"] is None and code["dirty"] is None and code["rlcompare"]


def test_no_git_or_a_hung_git_reads_as_unknown(monkeypatch):
    def missing(*a, **k):
        raise FileNotFoundError("git")

    monkeypatch.setattr(P.subprocess, "run", missing)
    assert P.code_version()["commit"] is None

    def hung(*a, **k):
        raise subprocess.TimeoutExpired("git", P.GIT_TIMEOUT_S)

    monkeypatch.setattr(P.subprocess, "run", hung)
    assert P.code_version()["commit"] is None


def test_launcher_names_torchrun_and_the_multirun_launcher():
    assert P.launcher(False, None) == "single"
    assert P.launcher(True, None) == "torchrun"
    assert P.launcher(False, "joblib") == "multirun:joblib"
    assert P.launcher(True, "submitit_slurm") == "torchrun+multirun:submitit_slurm"


def test_a_run_writes_its_provenance_into_summary_json(compose):
    cfg = compose("run_name=prov", "trainer.threads=1", "device=cpu")
    s = train(cfg)
    on_disk = json.loads((Path(s["run_dir"]) / "summary.json").read_text())
    prov = on_disk["provenance"]
    assert prov["threads"] == 1 and prov["device"] == "cpu" and prov["launcher"] == "single"
    assert prov["libraries"]["torch"] == torch.__version__ and prov["code"]["commit"]
    fingerprint = json.loads((Path(s["run_dir"]) / "fingerprint.json").read_text())
    assert "provenance" not in json.dumps(fingerprint)  # it does not define the experiment


def test_the_report_names_the_fields_compared_runs_differ_in(tmp_path):
    from rlcompare.report import build_report
    from test_report import make_run

    for s in range(3):
        d = make_run(tmp_path, f"a_s{s}", s, [0.1, 0.2, 0.3])
        summary = json.loads((d / "summary.json").read_text())
        summary["provenance"] = P.collect("cpu", 1 if s < 2 else 4, "single")
        summary["provenance"]["libraries"]["torch"] = "2.13.0" if s == 0 else "2.12.1"
        (d / "summary.json").write_text(json.dumps(summary))
    flags = build_report(tmp_path / "exp", write=False)["flags"]
    flag = next(f for f in flags if "different setups" in f)
    assert "libraries.torch: 2.13.0 (1 run) vs 2.12.1 (2 runs)" in flag
    assert "threads: 1 (2 runs) vs 4 (1 run)" in flag
    assert "python" not in flag and "device" not in flag  # fields that agree are not named
