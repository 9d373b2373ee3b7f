"""What a PORT assumes about candidate stalls its rounds cannot see: the charge for one unseen
stall in every PORT bound, the stall a PORT survives beyond it, and the words that say both.

A stall rarer than the rounds is absent from most samples, and a sample without it shows the
candidate faster than it is; no rule can see it without assuming its size
(docs/decision-rule.md, "The unseen stall, charged"). :mod:`stagelab.analyse.stats` applies
these to a family's cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stagelab.core import design


@dataclass(frozen=True)
class StallCharge:
    """The unseen stall every PORT bound of a family charges: one call ``allowance`` times an
    ordinary one among the family's ``rounds`` (:func:`stagelab.core.design.unseen_stall_charge`:
    the same candidate in every cell, so the family's rounds together are what could miss it)."""

    allowance: float
    rounds: int

    @property
    def share(self) -> float:
        """The share of the candidate's mean charged (0 where no cell was measured)."""
        return design.unseen_stall_charge(self.rounds, self.allowance) if self.rounds else 0.0

    def charged(self, bound: float) -> float:
        """A speedup bound with the candidate's mean raised by the charge."""
        return bound / (1 + self.share)

    def words(self) -> str:
        return (f"charged for one unseen {self.allowance:g}x candidate stall in the family's "
                f"{self.rounds:,} rounds ({self.share:.2%} of its mean)")


def stall_budget(bound: float, bar: float, unexcluded: int) -> float:
    """The stall a PORT survives: how many times slower a candidate call stalling once in
    ``unexcluded`` rounds (the rarest rate its rounds cannot exclude) would have to be for the
    candidate's mean to grow by the margin of ``bound`` over ``bar``, ``1 + unexcluded (bound /
    bar - 1)``. No rule can see a stall rarer than its rounds without assuming its size; this
    states the size the answer assumes away."""
    if not (bar > 0 and bound > 0 and unexcluded >= 1):
        raise ValueError(f"bound and bar must be positive and unexcluded at least 1, got "
                         f"{bound!r}, {bar!r}, {unexcluded!r}")
    return 1 + unexcluded * (bound / bar - 1)


def stall_words(rounds: Sequence[int]) -> str:
    """What the rounds cannot show about rare candidate stalls: the rarest stall that the
    family's measured cells' ``rounds`` together (and one cell's alone) could have missed with
    more than 5 % chance ('' where no cell was measured)."""
    if not rounds:
        return ""
    return (f"a candidate stall rarer than 1 in {design.rarest_unexcluded(sum(rounds)):,} calls "
            f"cannot be excluded by the family's {sum(rounds):,} rounds (one cell's "
            f"{min(rounds)}: 1 in {design.rarest_unexcluded(min(rounds)):,})")
