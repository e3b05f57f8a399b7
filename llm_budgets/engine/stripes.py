"""Hot caps: a budget's counter split into stripes, each with its own allowance.

A hot budget (``Budget.hot``) counts each period on ``Budget.stripes`` counter rows instead of
one, so admissions under it do not all wait for one row lock (docs/design/hot-caps.md). The cap
is the sum over the stripes; each stripe admits on its own only up to its ``allowance``, and
only while the budget's effective limit (its limit plus active raises) is the one the
allowances were split for (``split_for``).

The **allowance invariant**, kept by every path that writes allowances, for the stripes of one
key with ``used = spent + reserved``::

    sum(max(0, allowance_i - used_i)) <= max(0, split_for - sum(used_i))

With it, admissions that each stay within their stripe's allowance can never take the cap past
``split_for``: admitting ``a`` on a stripe lowers both sides by ``a``; releasing raises the right
side at least as much as the left. A commit above its hold (recorded overage) may use more than
its stripe's allowance; then the cap can end above its limit by at most that overage, as the
guarantee allows (:func:`allowance_excess` nets it out).

Rolling budgets are never striped: their window moves without a write, so they always take the
exact path (their budget row serialises them, as before).
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_FLOOR, Decimal
from typing import TYPE_CHECKING

from llm_budgets.models import Budget, Counter
from llm_budgets.money import QUANTUM, ZERO
from llm_budgets.windows import rolling_window

if TYPE_CHECKING:
    from llm_budgets.engine.types import ApplicableBudget


def striped(budget: Budget) -> bool:
    """Whether admission splits this budget's counter into stripes."""
    return budget.hot and rolling_window(budget.window) is None


def stripe_numbers(item: ApplicableBudget) -> range:
    """The stripes a budget's counter has: ``0..K-1`` when striped, else just ``0``."""
    return range(item.budget.stripes if striped(item.budget) else 1)


def target(rows: Sequence[Counter]) -> Counter:
    """The row of a key a hold is taken on when every row is locked: the lowest stripe."""
    return min(rows, key=lambda c: c.stripe)


def used(counter: Counter) -> Decimal:
    return counter.spent + counter.reserved


def resplit(rows: Sequence[Counter], limit: Decimal, stripes: int) -> None:
    """Split what the cap has left, ``max(0, limit - sum(used))``, evenly over stripes
    ``0..stripes-1`` (the remainder of the rounding on the lowest): each stripe's allowance is
    its own use plus its share, and all are marked split for ``limit``. Stripes beyond
    ``stripes`` (the budget was split finer before) get no share. The caller holds every row
    of the key locked; afterwards the allowance invariant holds with equality."""
    room = max(ZERO, limit - sum((used(c) for c in rows), ZERO))
    active = sorted((c for c in rows if c.stripe < stripes), key=lambda c: c.stripe)
    share = (room / len(active)).quantize(QUANTUM, rounding=ROUND_FLOOR) if active else ZERO
    for counter in rows:
        counter.allowance = used(counter) + (share if counter.stripe < stripes else ZERO)
        counter.split_for = limit
    if active:
        active[0].allowance = (active[0].allowance or ZERO) + room - share * len(active)


def unsplit(rows: Sequence[Counter]) -> bool:
    """Forget the allowances of a key that is no longer striped (the budget was made not hot,
    or is checked on its whole sum); returns whether any row changed."""
    changed = False
    for counter in rows:
        if counter.allowance is not None or counter.split_for is not None:
            counter.allowance = counter.split_for = None
            changed = True
    return changed


def allowance_excess(rows: Sequence[Counter]) -> Decimal:
    """How far the stripes of one key break the allowance invariant, net of recorded overage
    (use above a stripe's allowance, which only a commit above its hold produces): zero when
    the stripes can together admit no more than their ``split_for`` leaves. Rows that were
    never split, or split for different limits (a torn write), are reported by their sum."""
    split = [c for c in rows if c.split_for is not None and c.allowance is not None]
    if not split:
        return ZERO
    limits = {c.split_for for c in split}
    if len(limits) > 1:
        return sum((max(ZERO, c.allowance - used(c)) for c in split if c.allowance), ZERO)
    (limit,) = limits
    assert limit is not None
    total = sum((used(c) for c in rows), ZERO)
    free = sum((max(ZERO, c.allowance - used(c)) for c in split if c.allowance is not None), ZERO)
    over = sum((max(ZERO, used(c) - c.allowance) for c in split if c.allowance is not None), ZERO)
    return max(ZERO, free - max(ZERO, limit - total) - over)
