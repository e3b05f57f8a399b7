from __future__ import annotations

import os

import pytest
from django.db import connection


def pytest_report_header() -> str:
    url = os.environ.get("DATABASE_URL", "(default SQLite)")
    return f"llm_budgets: DATABASE_URL={url}"


@pytest.fixture
def on_postgres() -> bool:
    return connection.vendor == "postgresql"
