"""Scaling efficiency of data-parallel training (issue 21), with the two sides' steps interleaved: one process and N
torchrun ranks run at once, taking turns a step at a time. A measurement script, not a test.

    python scripts/dp_interleaved.py [--ranks 2] [--size 4.2M] [--prompts 16] [--steps 24] [--warmup 2] [--turn 1]
                                     [--ceiling] [--against OVERRIDE ...]

`scripts/dp_scaling.py` runs the one-process run and the N-rank run one after the other, and this host's speed
drifts by more than the effect measured between the two (a repeat's efficiency has moved from 0.71 to 0.98 on the
same code). Here both runs are started together and each step is a turn: the controller lets one side run its
step k while the other waits (blocked on a socket, off the cores), then the other its step k, the side that goes
first changing every turn, so that step k of both sides meets the same host (`--turn K`: K steps a turn). Both sides train the same run
(`scripts/dp_scaling.py`'s overrides: group streams, the same tokens every step), so each step gives a pair:
efficiency of step k = time(one process, step k) / (N x time(N ranks, step k)) (the tokens are the same), and over
the steps after `--warmup` the throughputs' ratio, as dp_scaling.py computes it, with the median and quartiles of
the steps' own ratios.

`--ceiling` adds two sides, one process on a rank's share of the batch and N of them side by side, and splits the
efficiency into the three factors of `scripts/dp_scaling.py --ceiling`, all from the same turns. `--against
OVERRIDE ...` adds a second N-rank side with those overrides (an A/B of a data-parallel change, e.g.
`trainer.grad_sum=backend`): its steps against the first side's, step by step, where both sampled the same tokens.

What interleaving changes: each side starts its step after the other has used the caches, so both pay a cold
cache each step (the model and AdamW's state, about 50 MB at 4.2M, do not fit in cache anyway). Nothing else: the
one process still runs alone on the machine, and the ranks alone on theirs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from dp_scaling import add_run_options, overrides, run_rows, same_through, tokens_per_s  # noqa: E402

# Run in every process in place of `python -m rlcompare.cli`: each `Trainer.step` reports its end ("d" on the socket)
# and then waits for the controller's next turn ("g") before it returns, so that nothing of a side runs outside its
# turns (after the last step, the end of the run waits for the controller too); the first step introduces the
# process by its side and rank, and waits for its first turn.
_WRAPPER = r"""
import os, runpy, socket, sys
import rlcompare.train.trainer as trainer_mod

step = trainer_mod.Trainer.step
conn = []

def turn_step(self):
    if not conn:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.environ["TURN_SOCKET"])
        s.sendall(f"{os.environ['TURN_SIDE']}:{os.environ.get('RANK', '0')}".encode().ljust(32))
        conn.append(s)
        wait_turn()
    try:
        return step(self)
    finally:  # and hold until the next turn, so that the end of the run also waits its turn
        conn[0].sendall(b"d")
        wait_turn()

def wait_turn():
    if conn[0].recv(1) != b"g":
        raise SystemExit("dp_interleaved: the controller went away")

trainer_mod.Trainer.step = turn_step
sys.argv = ["rlcompare", *sys.argv[1:]]
runpy.run_module("rlcompare.cli", run_name="__main__")
"""


def recv_exact(conn: socket.socket, n: int, procs: dict) -> bytes:
    """n bytes from `conn`; fails when the peer closed or a process of the run exited with an error."""
    got = b""
    while len(got) < n:
        try:
            chunk = conn.recv(n - len(got))
        except TimeoutError:
            failed(procs)
            continue
        if not chunk:
            failed(procs, force=True)
        got += chunk
    return got


def failed(procs: dict, force: bool = False) -> None:
    """Exit naming the command that failed and its stderr's end, if one has (or `force`: a turn's socket closed)."""
    bad = [(p, log) for p, log in procs.items() if p.poll() not in (None, 0) or (force and p.poll() is not None)]
    if not bad and not force:
        return
    for q in procs:
        q.kill()
    if not bad:
        sys.exit("a process closed its turn socket without exiting")
    p, log = bad[0]
    sys.exit(f"failed ({p.returncode}): {' '.join(p.args)}\n{log.read_text()[-3000:]}")


def step_times(results: Path) -> tuple[list[float], list[int]]:
    rows = run_rows(results)
    return [r["time/step_s"] for r in rows], [r["tokens/step"] for r in rows]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(p, steps=24)
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="also interleave one process on prompts / ranks ('part') and N such processes side by side ('side'), "
        "and split the efficiency into bound x side by side x the rest, as scripts/dp_scaling.py --ceiling does",
    )
    p.add_argument(
        "--against",
        nargs="+",
        default=[],
        metavar="OVERRIDE",
        help="a second N-rank side with these overrides, timed against the first step by step",
    )
    p.add_argument(
        "--turn",
        type=int,
        default=1,
        help="steps a side runs in each turn (1: the finest interleaving; more: fewer switches between sides)",
    )
    a = p.parse_args()
    if a.steps <= a.warmup:
        p.error(f"--steps ({a.steps}) must exceed --warmup ({a.warmup})")
    if a.ceiling and a.prompts % a.ranks:
        p.error(f"--ceiling needs --prompts divisible by --ranks ({a.prompts} by {a.ranks})")
    tmp = Path(tempfile.mkdtemp(prefix="dp_interleaved-"))
    try:
        times = interleave(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report(a, times)


def interleave(a, tmp: Path) -> dict[str, list[tuple[list[float], list[int]]]]:
    """Run every side's processes, a step each in turn; each side's (step times, tokens) per process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "TURN_SOCKET": str(tmp / "turns.sock")}
    env.setdefault("RLCOMPARE_CACHE", str(tmp / "cache"))
    (tmp / "wrapper.py").write_text(_WRAPPER)
    one = [sys.executable, str(tmp / "wrapper.py"), "train", "trainer.threads=1"]
    ranks = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.ranks}"]
    part = a.prompts // a.ranks
    # side: [(command, prompts, processes it connects)]
    sides = {
        "one": [(one, a.prompts, 1)],
        "ranks": [([*ranks, str(tmp / "wrapper.py"), "train", "trainer.parallel=ddp"], a.prompts, a.ranks)],
    }
    if a.against:
        sides["against"] = [([*sides["ranks"][0][0], *a.against], a.prompts, a.ranks)]
    if a.ceiling:
        sides["part"] = [(one, part, 1)]
        sides["side"] = [(one, part, 1)] * a.ranks
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(env["TURN_SOCKET"])
    expected = sum(n for runs in sides.values() for _, _, n in runs)
    server.listen(expected)
    server.settimeout(1.0)
    procs: dict[subprocess.Popen, Path] = {}
    results: dict[str, list[Path]] = {}
    try:
        for side, runs in sides.items():
            for i, (cmd, prompts, _) in enumerate(runs):
                out, log = tmp / f"{side}{i}", tmp / f"{side}{i}.log"
                results.setdefault(side, []).append(out)
                with log.open("w") as err:
                    proc = subprocess.Popen(
                        [*cmd, *overrides(a.size, prompts, a.steps, out)],
                        env={**env, "TURN_SIDE": side},
                        cwd=REPO,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                    )
                procs[proc] = log
        turns: dict[str, list[socket.socket]] = {side: [] for side in sides}
        while sum(map(len, turns.values())) < expected:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                failed(procs)
                continue
            conn.settimeout(1.0)
            turns[recv_exact(conn, 32, procs).decode().strip().split(":")[0]].append(conn)
        order = list(sides)
        for k in range(-(-a.steps // a.turn)):
            for side in order[k % len(order) :] + order[: k % len(order)]:  # each side first in turn
                for _ in range(min(a.turn, a.steps - k * a.turn)):
                    for conn in turns[side]:
                        conn.sendall(b"g")
                    for conn in turns[side]:
                        recv_exact(conn, 1, procs)
        for conns in turns.values():  # the end of the run: every side at once (not measured)
            for conn in conns:
                conn.sendall(b"g")
        for proc in procs:
            proc.wait()
        failed(procs)
        return {side: [step_times(d) for d in dirs] for side, dirs in results.items()}
    finally:
        for proc in procs:
            proc.kill()
        server.close()


def spread(xs: list[float], fmt: str, unit: str = "") -> str:
    """The median and quartiles of per-step figures."""
    q1, med, q3 = statistics.quantiles(xs, n=4)
    return f"median {med:{fmt}}{unit}, quartiles {q1:{fmt}}-{q3:{fmt}}{unit}"


def report(a, times: dict) -> int:
    w, n = a.warmup, a.ranks
    (one_t, one_tok), (ranks_t, ranks_tok) = times["one"][0], times["ranks"][0]
    same = same_through(one_tok, ranks_tok)
    t1, tn = tokens_per_s(one_tok, one_t, w), tokens_per_s(ranks_tok, ranks_t, w)
    eff = tn / (n * t1)
    # a step's pair: both sides sampled the same tokens (through step `same`), so its efficiency is the times' ratio
    per_step = [o / (n * r) for o, r in zip(one_t[w:same], ranks_t[w:same])]
    print(
        f"size {a.size}, {a.prompts} prompts x 8 per step, {a.steps} steps interleaved ({w} left out), 1 thread per "
        "process"
    )
    print(f"one process:  {t1:8.0f} tokens/s   (median step {1000 * statistics.median(one_t[w:]):.0f} ms)")
    print(f"{n} ranks:      {tn:8.0f} tokens/s   (median step {1000 * statistics.median(ranks_t[w:]):.0f} ms)")
    print(f"speed-up {tn / t1:.2f}x, scaling efficiency {eff:.2f}")
    if len(per_step) > 1:
        print(
            f"each step's own efficiency (steps {w + 1}-{same}): {spread(per_step, '.2f')}, "
            f"range {min(per_step):.2f}-{max(per_step):.2f}"
        )
    print(f"the same tokens per step through step {same} of {a.steps}")
    summary = {
        "size": a.size,
        "prompts": a.prompts,
        "ranks": n,
        "steps": a.steps,
        "warmup": w,
        "one_tokens_per_s": t1,
        "ranks_tokens_per_s": tn,
        "efficiency": eff,
        "efficiency_by_step": per_step,
        "same_tokens_through_step": same,
        "one_step_s": one_t,
        "ranks_step_s": ranks_t,
    }
    if a.ceiling:
        part_t = times["part"][0][0]
        side_t = [statistics.fmean(ts) for ts in zip(*(t for t, _ in times["side"]))]  # the N processes' mean
        # as dp_scaling.py: the share's step over the whole batch's bounds the efficiency (fixed costs per step);
        # the part and the side-by-side processes run the same config, so their steps pair as well
        bound = sum(one_t[w:]) / (n * sum(part_t[w:]))
        ceiling = sum(part_t[w:]) / sum(side_t[w:])
        rest = eff / (bound * ceiling)
        print(
            f"one process on {a.prompts // n} prompts: median step {1000 * statistics.median(part_t[w:]):.0f} ms; "
            f"{n} of them side by side: {1000 * statistics.median(side_t[w:]):.0f} ms"
        )
        print(
            f"efficiency {eff:.2f} = bound {bound:.2f} (1/{n} of the batch's step against the whole's) x side by "
            f"side {ceiling:.2f} x {rest:.2f} (the collectives and the waits for the slowest rank)"
        )
        summary.update(
            bound=bound, side_by_side=ceiling, collectives_and_waits=rest, part_step_s=part_t, side_step_s=side_t
        )
    if a.against:
        b_t, b_tok = times["against"][0]
        both = same_through(ranks_tok, b_tok)
        ratio = [x / y for x, y in zip(ranks_t[w:both], b_t[w:both])]
        line = f"{n} ranks with {' '.join(a.against)}: median step {1000 * statistics.median(b_t[w:]):.0f} ms"
        if len(ratio) > 1:
            line += (
                f"; speed against the first {n} ranks, step by step (steps {w + 1}-{both}): {spread(ratio, '.3f', 'x')}"
            )
        print(line + f"; the same tokens as the first through step {both}")
        summary.update(against=a.against, against_step_s=b_t, against_speed_by_step=ratio)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
