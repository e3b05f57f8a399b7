"""Prices and estimates: price tables, model names, token counts, costs, and the worst case of a
request."""
