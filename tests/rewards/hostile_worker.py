"""A verifier that, inside its scoring worker, writes a crafted reply to the parent: a pickle that creates a file
when unpickled. It stands for a worker compromised by what it parses (model output); the parent must not run it.
Imported by tests/rewards/test_verifiers_hostile.py; a module of its own so that the worker can import it."""

import os
import pickle
import struct
import sys

from rlcompare.rewards.verifiers import Score, Verifier


class _CreatesFile:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):  # unpickling calls open(path, "w"): the file appears
        return (open, (self.path, "w"))


class PicklingWorkerVerifier(Verifier):
    name = "pickling_worker"
    bounded, isolation, workers = False, "process", 1  # scored in one worker process

    def __init__(self, marker: str):
        self.marker = marker

    def score(self, completion: str, answer: str) -> Score:
        fd = int(sys.argv[1])  # the worker's end of the socketpair (rlcompare.rewards.verifiers._worker_entry)
        payload = pickle.dumps(_CreatesFile(self.marker))
        os.write(fd, struct.pack("!i", len(payload)) + payload)  # multiprocessing.connection's framing
        return Score(1.0, True)
