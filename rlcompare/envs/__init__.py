"""Environments: what answers the policy between its turns in a multi-turn or tool-use episode (#51)."""
