"""The locking core: every module here takes or depends on row locks on budget counters.

``admission`` takes holds, ``settlement`` ends them, ``statements`` is the SQL text both run,
``boundary`` turns operational database failures into ``LedgerUnavailable`` and bounds lock
waits. Changes here are reviewed as one unit against DESIGN.md section 3 (the invariants);
docs/architecture.md has the map.
"""
