"""A separate process that pushes Stripe usage: ``python tests/stripe_push_child.py <iso now>``
(DATABASE_URL, STRIPE_API_KEY and STRIPE_API_BASE from the environment)."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django

django.setup()

from llm_budgets.billing.stripe_push import stripe_push  # noqa: E402

if __name__ == "__main__":
    print(stripe_push(now=datetime.fromisoformat(sys.argv[1])), flush=True)
