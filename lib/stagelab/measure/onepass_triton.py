"""The one-pass kernel in Triton: top-K, logsumexp, the target's logprob and rank in one read.

Each program walks vocabulary tiles of one row (or of one slice of a row: the split variant)
keeping, in registers, a running max, the sum of exponentials rescaled to it, the counts of
logits at or above the target's (its rank, vLLM's convention: ties count against the target)
and equal to it, and the best ``K_PAD`` entries so far as int64 keys:
the value's bits in an order-preserving integer form in the high 32 bits, the complement of the
token id in the low 32 bits. Keys are unique per row and order by value, then by lower id, so
``tl.topk`` on them gives exactly "descending, ties by lower token id", and merging two lists of
keys (a tile's and the running one, or two splits') is exact. A tile whose fp32 max is not
above the running K-th value cannot enter the top-K: it skips the keys and the merge.

Where a row is split, each slice writes its partial state and a second, tiny kernel merges the
slices per row. The same merge folds logits that arrive one vocabulary tile at a time (the
``head_fused`` prompt method: the lm_head's product, a ``[C, tile]`` block at a time):
:func:`fold_kernel` merges each tile's state into a running one kept per row in memory, and
:func:`finish_kernel` writes the results from it. Imported lazily by
:mod:`stagelab.measure.onepass`: where Triton is absent this module still imports (``triton`` is
None) and the caller falls back to torch.
"""

from __future__ import annotations

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

    @triton.jit
    def _keys(x, cols):
        """Unique int64 keys ordering by value (fp32, -0.0 as 0.0), then by lower id."""
        x = tl.where(x == 0.0, 0.0, x)
        bits = x.to(tl.int32, bitcast=True)
        ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        return (ordered.to(tl.int64) << 32) + (ID_MASK - cols.to(tl.int64))

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
    def _tile_state(x_ptr, start, stop, target, first_id, BLOCK: tl.constexpr,
                    K_PAD: tl.constexpr, TOPK: tl.constexpr, HAS_TARGET: tl.constexpr):
        """Walk tiles ``[start, stop)`` of one row, whose column ``c`` is token ``first_id + c``:
        (max, rescaled sum, best keys, count of logits ``>=`` the target's, count equal to it)."""
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((), tl.float32)
        ge = tl.zeros((), tl.int32)
        eq = tl.zeros((), tl.int32)
        best = tl.full((K_PAD,), KEY_FLOOR, tl.int64)
        # The guard's threshold: the fp32 value of the least key held, NaN until K_PAD keys are
        # (KEY_FLOOR decodes to NaN). Tiles come in order of their ids, so a later value equal
        # to it has a higher id, a lower key: only a tile whose max is above it can enter.
        kth = tl.full((), float("nan"), tl.float32)
        floor = tl.full((BLOCK,), KEY_FLOOR, tl.int64)
        offsets = tl.arange(0, BLOCK)
        # One tile loaded ahead (launches.PREFETCH_TILES): its load is issued before the
        # current tile's work, so that it is in flight while the program computes.
        ahead = tl.load(x_ptr + start + offsets, mask=start + offsets < stop,
                        other=float("-inf"))
        for tile in range(start, stop, BLOCK):
            cols = tile + offsets
            inside = cols < stop
            x = ahead.to(tl.float32)
            ahead = tl.load(x_ptr + cols + BLOCK, mask=cols + BLOCK < stop, other=float("-inf"))
            top = tl.max(x, axis=0)
            m_new = tl.maximum(m, top)
            safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - safe) + tl.sum(tl.exp(x - safe), axis=0)
            m = m_new
            if HAS_TARGET:
                ge += tl.sum((inside & (x >= target)).to(tl.int32), axis=0)
                eq += tl.sum((inside & (x == target)).to(tl.int32), axis=0)
            if TOPK:
                if (top > kth) | (kth != kth):  # no int64 key before this passes
                    keys = tl.where(inside, _keys(x, cols + first_id), floor)
                    best = _merge(best, tl.topk(keys, K_PAD))
                    kth, _ = _decode(tl.min(best, axis=0))
        return m, s, best, ge, eq

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
        m, s, best, ge, eq = _tile_state(x_row, start, stop, target, 0, BLOCK, K_PAD, TOPK,
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
                    state_keys_ptr, state_ge_ptr, state_eq_ptr, BLOCK: tl.constexpr,
                    K_PAD: tl.constexpr, TOPK: tl.constexpr, HAS_TARGET: tl.constexpr):
        """Program ``row``: the state of its tile of logits ``[0, width)`` (tokens ``first_id``
        on), merged into the row's running state in place, as the split variant's merge does."""
        row = tl.program_id(0).to(tl.int64)
        target = 0.0
        if HAS_TARGET:
            target = tl.load(target_ptr + row)
        m, s, best, ge, eq = _tile_state(x_ptr + row * stride_row, 0, width, target, first_id,
                                         BLOCK, K_PAD, TOPK, HAS_TARGET)
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
