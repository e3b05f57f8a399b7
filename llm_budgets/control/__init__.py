"""The knobs hosts and support turn: limits, raises, kill switches, and the record of refusals."""
