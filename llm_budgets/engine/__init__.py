"""The locking core: every module here takes or depends on row locks on budget counters.

``admission`` takes holds, ``settlement`` ends them, ``counters`` defines the counter key and
reads and locks counter rows by it, ``statements`` is the SQL text they run, ``boundary`` turns
operational database failures into ``LedgerUnavailable`` (and lets faults in our own SQL surface)
and bounds lock waits. Changes here are reviewed as one unit against DESIGN.md section 3 (the
invariants); docs/architecture.md has the map.
"""
