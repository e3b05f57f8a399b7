"""Settings of the gunicorn workers bench/load.py starts: the project's, without the per-key
throttle (the clients are the load, not abuse) and without DEBUG."""

from project.settings import *  # noqa: F403

DEBUG = False
LLM_BUDGETS = {**LLM_BUDGETS, "API_THROTTLE_RATE": None}  # noqa: F405
