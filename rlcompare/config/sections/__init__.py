"""The config's sections, one module each, in the order a run's data flows: prompts → model (and the teacher) →
rollout → algorithm → trainer → evaluation (`eval.*`).

A section module holds its dataclasses (each field's comment is its help: config/doc.py reads it into
docs/config.md), the values it accepts, its `RANGES` (numbers narrower than non-negative) and `check(section)`,
which reads that section only. rlcompare/config/schema.py composes them into `RunConfig`, runs the checks in
`validate`, and keeps every check that reads two sections (the algorithm's needs of the trainer, the teacher and
the budget; a budget that fits the model's context; what rollout.engine=vllm cannot honour), the run's own keys, and,
for now, the env and verifier sections.

Why here and not beside the packages that act on them (train/, models/, rollout/): the config check runs before
torch loads and in torch-free commands (sweep, report), and config may import only algos and rewards
(docs/internals.md's layer table).

Adding a key: a field with its comment in its section's dataclass, the same default in conf/, its range in that
module's RANGES when narrower than non-negative, a check there (in schema.py when it reads another section), then
`python scripts/config_doc.py`.
"""
