"""Three questions, one change: the bundle (the pinned grow-only scratch against the fresh
vector), pinning alone and reuse alone, each decided as a family
(:func:`stagelab.analyse.stats.decide_family`), tested as a fixed sequence and turned into the
change to make (:func:`recommend`). Why a fixed sequence keeps the chance of any false answer at
the level of one test: docs/decision-rule.md, "Three questions, one change"."""

from __future__ import annotations

from collections.abc import Sequence

from stagelab.analyse.stats import CLOSE, INCONCLUSIVE, PORT, FamilyDecision

PORT_PINNED = "port the pinned scratch"
PORT_REUSED = "port a reused pageable buffer"
CLOSE_CHANGE = "close"
NOT_A_DECISION = "not a decision"
SEQUENCE = ("a fixed sequence, each family at the full level and the next tested only when the "
            "one before it answered: the bundle (pinned grow-only vs the fresh vector) first; "
            "if it PORTs, pinning alone (pinned grow-only vs grow-only pageable); if pinning "
            "CLOSEs (shown to add less than delta in every cell), reuse alone (grow-only pageable "
            "vs the fresh vector); if the bundle CLOSEs, reuse alone too (pinning may take back "
            "what reuse saves). A fixed sequence keeps the chance of any false answer at the "
            "level of one test, since a later test can only err once every earlier one has been "
            "passed")


def _word(answer: str | FamilyDecision | None) -> str | None:
    return answer.decision if isinstance(answer, FamilyDecision) else answer


def _cells_where(answer: str | FamilyDecision | None, decision: str,
                 names: Sequence[str] | None) -> list[str]:
    """The cells (by ``names``, else ``cell i``) of a family answer whose own decision is
    ``decision``; none for an answer given only in words."""
    if not isinstance(answer, FamilyDecision):
        return []
    label = list(names) if names is not None else [f"cell {i}" for i in range(len(answer.cells))]
    return [label[i] for i, cell in enumerate(answer.cells) if cell.decision == decision]


def _pinning_words(pinning: str | FamilyDecision | None, names: Sequence[str] | None) -> str:
    """Which cells pinning would help (adds more than delta beyond reuse), is shown not to, or
    leaves open; '' for an answer given only in words."""
    if not isinstance(pinning, FamilyDecision):
        return ""
    helps, not_worth = _cells_where(pinning, PORT, names), _cells_where(pinning, CLOSE, names)
    open_cells = _cells_where(pinning, INCONCLUSIVE, names)
    parts = [f"pinning would help (adds more than delta beyond reuse) in "
             f"{', '.join(helps) if helps else 'no cell'}"]
    if not_worth:
        parts.append(f"is shown to add less than delta in {', '.join(not_worth)}")
    if open_cells:
        parts.append(f"is unresolved in {', '.join(open_cells)}")
    return " (" + "; ".join(parts) + ")"


def recommend(bundle: str | FamilyDecision, pinning: str | FamilyDecision | None,
              reuse: str | FamilyDecision | None, *,
              cells: Sequence[str] | None = None) -> tuple[str, str]:
    """The change to make from the three family answers (each a decision word or the
    :class:`FamilyDecision` itself), tested as a fixed sequence (:data:`SEQUENCE`): port the
    pinned scratch, port a reused pageable buffer, close, or INCONCLUSIVE; and why. ``None``:
    that question was not measured. Given the pinning family itself, the reason names the cells
    pinning would help, if any (``cells``: the cells' names, in the family's order).

    Every answer it can give: the bundle closes, **close**, unless reuse alone ports (pinning
    takes back what reuse saves), **port a reused pageable buffer**; the bundle unresolved,
    INCONCLUSIVE; the bundle ports and pinning ports, **port the pinned scratch**; pinning not
    measured or unresolved, INCONCLUSIVE; pinning closes and reuse ports, **port a reused
    pageable buffer**; pinning closes and reuse closes too (neither part alone saves delta,
    together they do), **port the pinned scratch**; pinning closes and reuse is unresolved or
    not measured, INCONCLUSIVE."""
    bundle_word, pinning_word, reuse_word = _word(bundle), _word(pinning), _word(reuse)
    where = _pinning_words(pinning, cells)
    if bundle_word == CLOSE and reuse_word == PORT:
        return PORT_REUSED, ("the bundle (reuse + pinning) saves less than delta of the step in "
                             "every decisive cell, but reuse alone saves more than delta: pinning "
                             "takes back what reuse saves, so reuse is worth a change without it")
    if bundle_word == CLOSE:
        return CLOSE_CHANGE, ("the bundle (reuse + pinning) saves less than delta of the step in "
                              "every decisive cell, and reuse alone is not shown to save more")
    if bundle_word != PORT:
        return INCONCLUSIVE, "the bundle (reuse + pinning) is not resolved, so nothing follows"
    if pinning_word == PORT:
        return PORT_PINNED, ("the bundle ports, and pinning adds a saving above delta beyond a "
                             f"reused pageable buffer{where}")
    if pinning_word is None:
        return INCONCLUSIVE, ("the bundle ports, but pinning alone was not measured (no grow-only "
                              "pageable arm): whether a reused pageable buffer would do is open")
    if pinning_word != CLOSE:
        return INCONCLUSIVE, ("the bundle ports, but whether pinning adds more than delta beyond "
                              f"a reused pageable buffer is unresolved{where}: more rounds are "
                              "needed")
    if reuse_word == PORT:
        return PORT_REUSED, ("the bundle ports, pinning is shown to add less than delta beyond "
                             f"reuse in every cell{where}, and reuse alone saves more than delta")
    if reuse_word == CLOSE:
        return PORT_PINNED, ("the bundle ports, but neither part alone is shown to save delta: "
                             "pinning adds less than delta beyond reuse and reuse alone saves "
                             "less than delta, so only the two together (the pinned scratch) "
                             "are worth a change")
    return INCONCLUSIVE, ("the bundle ports and pinning adds less than delta, but whether reuse "
                          "alone saves more than delta is "
                          f"{'not measured' if reuse_word is None else 'unresolved'}")


PORT_PINNED_DEFERRED = "port the pinned scratch and defer its wait one step"
DEFERRAL_COST = ("what deferring costs an engine: each step's logprobs reach the host one step "
                 "late (the sampled token does not), the last step of a sequence is drained, "
                 "and the scratch holds two slots of pinned memory instead of one")
DEFERRAL_SEQUENCE = ("then, only where the pinned scratch is ported, deferring its wait "
                     "(the pinned scratch with its wait one step late vs the pinned scratch): "
                     "the sequence's fourth and last test")


def recommend_deferral(change: str, reason: str,
                       deferral: str | FamilyDecision | None) -> tuple[str, str]:
    """The change after the fourth family, deferring the wait given pinning, tested last in
    the fixed sequence (:data:`DEFERRAL_SEQUENCE`) and only where :func:`recommend` ports the
    pinned scratch: it PORTs, **port the pinned scratch and defer its wait one step** (the
    reason says what that costs, :data:`DEFERRAL_COST`); else the change stays, and the reason
    says whether deferring was not measured, shown to save less than delta, or unresolved."""
    if change != PORT_PINNED:
        return change, reason
    word = _word(deferral)
    if word == PORT:
        return PORT_PINNED_DEFERRED, (f"{reason}; deferring its wait one step saves more than "
                                      f"delta beyond the pinned scratch ({DEFERRAL_COST})")
    if word is None:
        return change, f"{reason}; deferring its wait was not measured (the full profile times it)"
    if word == CLOSE:
        return change, (f"{reason}; deferring its wait one step is shown to save less than delta "
                        "beyond the pinned scratch")
    return change, (f"{reason}; whether deferring its wait one step saves more than delta "
                    "beyond the pinned scratch is unresolved")
