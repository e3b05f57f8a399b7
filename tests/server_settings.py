"""Settings of the web processes the fault tests start (``tests/servers.py``): the project's,
with ``LLM_BUDGETS`` overrides from the ``LLMB_TEST_LLM_BUDGETS`` environment variable (JSON)."""

from __future__ import annotations

import json
import os

from project.settings import *  # noqa: F403
from project.settings import LLM_BUDGETS as _BASE

LLM_BUDGETS = {**_BASE, **json.loads(os.environ.get("LLMB_TEST_LLM_BUDGETS", "{}"))}

# Tracebacks of 500s into the process's log (tests/servers.py keeps it), whatever DEBUG is.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
        "llm_budgets": {"handlers": ["console"], "level": "WARNING"},
    },
}
