"""Training: the Hydra app's conf/ folder and run names (`app.py`), the pre-Hydra check of the command line
(`precheck.py`), `train(cfg)` (`run.py`), resume (`resume.py`), the loop (`trainer.py`), collection (`collect.py`),
the update (`update.py`), checkpoints, the run-folder lock, the results
writer and W&B (`tracking.py`), a multirun job's placement (`placement.py`).

Kept import-free: `precheck`, `app` and `placement` must load without torch. Never imports report, sweep,
bench or the CLI.
"""
