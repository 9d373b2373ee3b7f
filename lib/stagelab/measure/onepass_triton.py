"""The one-pass kernel in Triton: top-K, logsumexp, the target's logprob and rank in one read.

Each program walks vocabulary tiles of one row (or of one slice of a row: the split variant)
keeping, in registers, a running max, per lane the sum of exponentials rescaled to it and the
counts of logits at or above the target's (its rank, vLLM's convention: ties count against the
target) and equal to it (reduced across lanes once, at the end), and the best ``K_PAD`` entries
so far as int64 keys: the value's bits in an order-preserving integer form in the high 32 bits,
the complement of the token id in the low 32 bits. Keys are unique per row and order by value,
then by lower id, so ``tl.topk`` on them gives exactly "descending, ties by lower token id", and
merging two lists of keys (a tile's and the running one, or two splits') is exact. A tile whose
fp32 max is not above the ``k``-th key held cannot enter the top-K and costs nothing more; one
that can takes its best ``k`` candidates one by one (at most ``launches.CANDIDATE_LIMIT``
passes), or else sorts its top ``K_PAD``, and merges them (:func:`_enter`).

Where a row is split, each slice writes its partial state and a second, tiny kernel merges the
slices per row. The same merge folds logits that arrive one vocabulary tile at a time (the
``head_fused`` prompt method: the lm_head's product, a ``[C, tile]`` block at a time):
:func:`fold_kernel` merges each tile's state into a running one kept per row in memory, and
:func:`finish_kernel` writes the results from it. Imported lazily by
:mod:`stagelab.measure.onepass`: where Triton is absent this module still imports (``triton`` is
None) and the caller falls back to torch.
"""

from __future__ import annotations

from stagelab.core import launches

try:
    import triton
    import triton.language as tl
except ImportError:  # the measuring floor loads with torch alone; the caller says why
    triton = None

if triton is not None:
    # The key of a padding lane: below every real key (a real value's high word is above
    # -2**31); the mask of a key's id word.
    KEY_FLOOR = tl.constexpr(-(2**63))
    ID_MASK = tl.constexpr(0xFFFFFFFF)
    ORDERED_FLOOR = tl.constexpr(-(2**31))  # KEY_FLOOR's high word: below every real value's
    ID_LIMIT = tl.constexpr(2**31 - 1)  # above every token id
    LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E): one FFMA a logit
    CANDIDATES = tl.constexpr(launches.CANDIDATE_LIMIT)

    @triton.jit
    def _ordered(x):
        """fp32 values as int32 that order as the values do (-0.0 as 0.0): a key's high word."""
        x = tl.where(x == 0.0, 0.0, x)
        bits = x.to(tl.int32, bitcast=True)
        return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)

    @triton.jit
    def _keys(ordered, ids):
        """Unique int64 keys ordering by value (``ordered``: :func:`_ordered`), then lower id."""
        return (ordered.to(tl.int64) << 32) + (ID_MASK - ids.to(tl.int64))

    @triton.jit
    def _decode(keys):
        """The fp32 values and int64 ids of keys made by :func:`_keys`."""
        ids = ID_MASK - (keys & ID_MASK)
        ordered = (keys >> 32).to(tl.int32)
        bits = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
        return bits.to(tl.float32, bitcast=True), ids

    @triton.jit
    def _merge(best, other):
        """The best K of two descending lists of K unique keys, descending (a bitonic merge)."""
        return tl.bitonic_merge(tl.maximum(best, tl.flip(other, 0)), descending=True)

    @triton.jit
    def _kth(best, k, K_PAD: tl.constexpr):
        """The ordered value (:func:`_ordered`) of the ``k``-th best key held (``best`` is
        descending): ``ORDERED_FLOOR`` until ``k`` slots hold values."""
        held = tl.where(tl.arange(0, K_PAD) < k, best, -KEY_FLOOR - 1)
        return (tl.min(held, axis=0) >> 32).to(tl.int32)

    @triton.jit
    def _value(ordered):
        """The fp32 value of an ordered value (:func:`_ordered`): NaN for ``ORDERED_FLOOR``."""
        bits = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _enter(x, ids, inside, best, kth, k, K_PAD: tl.constexpr, MASKED: tl.constexpr):
        """The best keys (descending) after a tile's values ``x`` (``-inf`` where masked) enter
        them, and their ``k``-th's ordered value. The candidates are the values above the
        ``k``-th key held (the finite ones until ``k`` are held); the best ``k`` of them are
        taken one by one, the highest first (ties: the lowest id), into a descending list
        merged once, where that is at most ``CANDIDATES`` passes (and, until ``k`` keys are
        held, ``k`` finite values are there to take); else the tile's sorted top ``K_PAD`` is
        merged. A candidate is finite: a value taken becomes ``-inf``."""
        empty = kth == ORDERED_FLOOR
        floor = tl.where(empty, float("-inf"), _value(kth))
        above = tl.sum((x > floor).to(tl.int32), axis=0)
        takes = tl.minimum(above, k)
        if (takes > CANDIDATES) | (empty & (above < k)):
            ordered = _ordered(x)
            if MASKED:
                ordered = tl.where(inside, ordered, ORDERED_FLOOR)
            tile_best = tl.topk(_keys(ordered, ids), K_PAD)
        else:
            slots = tl.arange(0, K_PAD)
            tile_best = tl.full((K_PAD,), KEY_FLOOR, tl.int64)
            for slot in range(0, takes):
                top = tl.max(x, axis=0)
                id = tl.min(tl.where(x == top, ids, ID_LIMIT), axis=0)
                tile_best = tl.where(slots == slot, _keys(_ordered(top), id), tile_best)
                x = tl.where(ids == id, float("-inf"), x)
        best = _merge(best, tile_best)
        return best, _kth(best, k, K_PAD)

    @triton.jit
    def _walk_tile(x, cols, stop, first_id, target, m, s, counts, best, kth, k,
                   K_PAD: tl.constexpr, TOPK: tl.constexpr, HAS_TARGET: tl.constexpr,
                   MASKED: tl.constexpr):
        """One tile (fp32 ``x`` at columns ``cols``; ``-inf`` past ``stop`` where ``MASKED``)
        folded into the walk's state: the running max ``m``, per-lane sums of exponentials
        rescaled to it ``s``, per-lane counts (``>=`` the target in the low 16 bits, ``==`` it
        above), the best keys and their ``k``-th's ordered value ``kth``."""
        top = tl.max(x, axis=0)  # the one cross-warp step of a tile that enters nothing
        m_new = tl.maximum(m, top)
        scaled = tl.where(m_new == float("-inf"), 0.0, m_new) * LOG2E
        s = s * tl.exp2(m * LOG2E - scaled) + tl.exp2(x * LOG2E - scaled)
        inside = cols < stop
        if HAS_TARGET:
            counted = (x >= target).to(tl.int32) + ((x == target).to(tl.int32) << 16)
            if MASKED:
                counted = tl.where(inside, counted, 0)
            counts += counted
        if TOPK:
            if _ordered(top) > kth:  # no count or key before this passes
                best, kth = _enter(x, cols + first_id, inside, best, kth, k, K_PAD, MASKED)
        return m_new, s, counts, best, kth

    @triton.jit
    def _tile_state(x_ptr, start, stop, target, first_id, k, BLOCK: tl.constexpr,
                    K_PAD: tl.constexpr, TOPK: tl.constexpr, HAS_TARGET: tl.constexpr):
        """Walk tiles ``[start, stop)`` of one row, whose column ``c`` is token ``first_id + c``,
        for its top ``k``: (max, rescaled sum, best keys, count of logits ``>=`` the target's,
        count equal to it). Full tiles load unmasked, each two tiles ahead
        (launches.PREFETCH_TILES: the last full tile's address stands in past it); a ragged
        last tile is walked masked after them. The sums and counts are kept per lane and
        reduced once at the end; tiles come in order of their ids, so a later value equal to
        the ``k``-th key held has a higher id, a lower key: only a value above it can enter."""
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK,), tl.float32)
        counts = tl.zeros((BLOCK,), tl.int32)
        best = tl.full((K_PAD,), KEY_FLOOR, tl.int64)
        kth = tl.full((), ORDERED_FLOOR, tl.int32)
        offsets = tl.arange(0, BLOCK)
        full_stop = start + (stop - start) // BLOCK * BLOCK
        last = full_stop - BLOCK
        ahead = tl.load(x_ptr + start + offsets, mask=offsets < full_stop - start)
        after = tl.load(x_ptr + start + BLOCK + offsets,
                        mask=offsets < full_stop - start - BLOCK)
        for tile in range(start, full_stop, BLOCK):
            x = ahead.to(tl.float32)
            ahead = after
            after = tl.load(x_ptr + tl.minimum(tile + 2 * BLOCK, last) + offsets)
            m, s, counts, best, kth = _walk_tile(x, tile + offsets, stop, first_id, target, m,
                                                 s, counts, best, kth, k, K_PAD, TOPK,
                                                 HAS_TARGET, False)
        if full_stop < stop:
            cols = full_stop + offsets
            x = tl.load(x_ptr + cols, mask=cols < stop, other=float("-inf")).to(tl.float32)
            m, s, counts, best, kth = _walk_tile(x, cols, stop, first_id, target, m, s, counts,
                                                 best, kth, k, K_PAD, TOPK, HAS_TARGET, True)
        return (m, tl.sum(s, axis=0), best, tl.sum(counts & 0xFFFF, axis=0),
                tl.sum(counts >> 16, axis=0))

    @triton.jit
    def _fold(m, s, best, ge, eq, m_part, s_part, best_part, ge_part, eq_part,
              TOPK: tl.constexpr):
        """Two partial states of one row as one (``best_part`` unused without ``TOPK``)."""
        m_new = tl.maximum(m, m_part)
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - safe) + s_part * tl.exp(m_part - safe)
        if TOPK:
            best = _merge(best, best_part)
        return m_new, s, best, ge + ge_part, eq + eq_part

    @triton.jit
    def _finish(row, m, s, best, ge, eq, target, values_ptr, ids_ptr, lse_ptr, target_lp_ptr,
                rank_ptr, ties_ptr, k, K_PAD: tl.constexpr, TOPK: tl.constexpr,
                HAS_TARGET: tl.constexpr):
        """Write one row's results from its merged state."""
        lse = m + tl.log(s)
        tl.store(lse_ptr + row, lse)
        if HAS_TARGET:
            tl.store(target_lp_ptr + row, target - lse)
            tl.store(rank_ptr + row, ge)
            tl.store(ties_ptr + row, eq)
        if TOPK:
            values, ids = _decode(best)
            slots = tl.arange(0, K_PAD)
            tl.store(values_ptr + row * k + slots, values - lse, mask=slots < k)
            tl.store(ids_ptr + row * k + slots, ids, mask=slots < k)

    @triton.jit
    def onepass_kernel(x_ptr, stride_row, vocab, targets_ptr, values_ptr, ids_ptr, lse_ptr,
                       target_lp_ptr, rank_ptr, ties_ptr, part_m_ptr, part_s_ptr,
                       part_keys_ptr, part_ge_ptr, part_eq_ptr, k, span,
                       BLOCK: tl.constexpr, K_PAD: tl.constexpr, TOPK: tl.constexpr,
                       HAS_TARGET: tl.constexpr, SPLIT: tl.constexpr):
        """Program ``(row, slice)``: the slice ``[slice * span, (slice + 1) * span)`` of a row;
        with ``SPLIT`` it writes its partial state, else the row's results."""
        row = tl.program_id(0).to(tl.int64)
        part = tl.program_id(1)
        parts = tl.num_programs(1)
        x_row = x_ptr + row * stride_row
        target = 0.0
        if HAS_TARGET:
            target = tl.load(x_row + tl.load(targets_ptr + row)).to(tl.float32)
        start = part * span
        stop = tl.minimum(start + span, vocab)
        m, s, best, ge, eq = _tile_state(x_row, start, stop, target, 0, k, BLOCK, K_PAD, TOPK,
                                         HAS_TARGET)
        if SPLIT:
            at = row * parts + part
            tl.store(part_m_ptr + at, m)
            tl.store(part_s_ptr + at, s)
            tl.store(part_ge_ptr + at, ge)
            tl.store(part_eq_ptr + at, eq)
            if TOPK:
                tl.store(part_keys_ptr + at * K_PAD + tl.arange(0, K_PAD), best)
        else:
            _finish(row, m, s, best, ge, eq, target, values_ptr, ids_ptr, lse_ptr,
                    target_lp_ptr, rank_ptr, ties_ptr, k, K_PAD, TOPK, HAS_TARGET)

    @triton.jit
    def merge_kernel(x_ptr, stride_row, targets_ptr, values_ptr, ids_ptr, lse_ptr,
                     target_lp_ptr, rank_ptr, ties_ptr, part_m_ptr, part_s_ptr,
                     part_keys_ptr, part_ge_ptr, part_eq_ptr, k, parts,
                     K_PAD: tl.constexpr, TOPK: tl.constexpr, HAS_TARGET: tl.constexpr):
        """Program ``row``: merge its slices' partial states and write its results."""
        row = tl.program_id(0).to(tl.int64)
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((), tl.float32)
        ge = tl.zeros((), tl.int64)
        eq = tl.zeros((), tl.int64)
        best = tl.full((K_PAD,), KEY_FLOOR, tl.int64)
        slots = tl.arange(0, K_PAD)
        for part in range(0, parts):
            at = row * parts + part
            best_part = best
            if TOPK:
                best_part = tl.load(part_keys_ptr + at * K_PAD + slots)
            m, s, best, ge, eq = _fold(m, s, best, ge, eq, tl.load(part_m_ptr + at),
                                       tl.load(part_s_ptr + at), best_part,
                                       tl.load(part_ge_ptr + at), tl.load(part_eq_ptr + at),
                                       TOPK)
        target = 0.0
        if HAS_TARGET:
            target = tl.load(x_ptr + row * stride_row + tl.load(targets_ptr + row))
            target = target.to(tl.float32)
        _finish(row, m, s, best, ge, eq, target, values_ptr, ids_ptr, lse_ptr, target_lp_ptr,
                rank_ptr, ties_ptr, k, K_PAD, TOPK, HAS_TARGET)

    @triton.jit
    def fold_kernel(x_ptr, stride_row, width, first_id, target_ptr, state_m_ptr, state_s_ptr,
                    state_keys_ptr, state_ge_ptr, state_eq_ptr, k, BLOCK: tl.constexpr,
                    K_PAD: tl.constexpr, TOPK: tl.constexpr, HAS_TARGET: tl.constexpr):
        """Program ``row``: the state of its tile of logits ``[0, width)`` (tokens ``first_id``
        on), merged into the row's running state in place, as the split variant's merge does."""
        row = tl.program_id(0).to(tl.int64)
        target = 0.0
        if HAS_TARGET:
            target = tl.load(target_ptr + row)
        m, s, best, ge, eq = _tile_state(x_ptr + row * stride_row, 0, width, target, first_id,
                                         k, BLOCK, K_PAD, TOPK, HAS_TARGET)
        slots = row * K_PAD + tl.arange(0, K_PAD)
        running = best
        if TOPK:
            running = tl.load(state_keys_ptr + slots)
        m, s, best, ge, eq = _fold(tl.load(state_m_ptr + row), tl.load(state_s_ptr + row),
                                   running, tl.load(state_ge_ptr + row),
                                   tl.load(state_eq_ptr + row), m, s, best, ge, eq, TOPK)
        tl.store(state_m_ptr + row, m)
        tl.store(state_s_ptr + row, s)
        tl.store(state_ge_ptr + row, ge)
        tl.store(state_eq_ptr + row, eq)
        if TOPK:
            tl.store(state_keys_ptr + slots, best)

    @triton.jit
    def finish_kernel(target_ptr, values_ptr, ids_ptr, lse_ptr, target_lp_ptr, rank_ptr,
                      ties_ptr, state_m_ptr, state_s_ptr, state_keys_ptr, state_ge_ptr,
                      state_eq_ptr, k, K_PAD: tl.constexpr, TOPK: tl.constexpr,
                      HAS_TARGET: tl.constexpr):
        """Program ``row``: its results from the running state :func:`fold_kernel` left."""
        row = tl.program_id(0).to(tl.int64)
        target = 0.0
        if HAS_TARGET:
            target = tl.load(target_ptr + row)
        best = tl.full((K_PAD,), KEY_FLOOR, tl.int64)
        if TOPK:
            best = tl.load(state_keys_ptr + row * K_PAD + tl.arange(0, K_PAD))
        _finish(row, tl.load(state_m_ptr + row), tl.load(state_s_ptr + row), best,
                tl.load(state_ge_ptr + row), tl.load(state_eq_ptr + row), target, values_ptr,
                ids_ptr, lse_ptr, target_lp_ptr, rank_ptr, ties_ptr, k, K_PAD, TOPK, HAS_TARGET)
