"""Read-only answers above the engine: budget statuses, quotes, explanations, live usage (the
rollups plus the ledger's tail) and projections."""
