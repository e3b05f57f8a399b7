"""Read-only answers above the engine: budget statuses, quotes, explanations."""
