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
that can (:func:`_enter`) puts its values, the highest first, each in the place of the least
key held while one is above it, where ``K_PAD <= launches.CANDIDATE_LIMIT`` (an unsorted list,
sorted once at the end: no merge a tile; 16-bit logits take each value as one int32 key packed
with its offset in the tile, :func:`_packed`); a wider top-K takes its best ``k`` candidates
one by one (at most ``CANDIDATE_LIMIT`` passes), or else sorts its top ``K_PAD``, and merges
them.

Where a row is split, each slice writes its partial state and counts itself in; the row's last
slice to end merges them and writes the row's results (no second kernel, no second launch: the
"last program merges" of split-K kernels). The same state merge folds logits that arrive one
vocabulary tile at a time (the ``head_fused`` prompt method: the lm_head's product, a
``[C, tile]`` block at a time): :func:`fold_kernel` merges each tile's state into a running
one kept per row in memory, and :func:`finish_kernel` writes the results from it. Imported
lazily by :mod:`stagelab.measure.onepass`: where Triton is absent this module still imports
(``triton`` is None) and the caller falls back to torch.
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
    KEY_CEILING = tl.constexpr(2**63 - 1)  # above every key: a small top-K's unused slot
    ORDERED_FLOOR = tl.constexpr(-(2**31))  # KEY_FLOOR's high word: below every real value's
    ID_LIMIT = tl.constexpr(2**31 - 1)  # above every token id
    LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E): one FFMA a logit
    CANDIDATES = tl.constexpr(launches.CANDIDATE_LIMIT)
    STAGES = tl.constexpr(launches.PIPELINE_STAGES)  # the tile loop's pipelined loads
    # The low bits of a 16-bit float's fp32 form, all 0 (fp16's 13, bf16's 16): a packed key
    # (_packed) holds a tile offset there, so a tile of 16-bit logits packs up to 8192 wide.
    LOW_MASK = tl.constexpr(2**13 - 1)
    HIGH_MASK = tl.constexpr(-(2**13))  # its complement

    @triton.jit
    def _ordered(x):
        """fp32 values as int32 that order as the values do (-0.0 as 0.0): a key's high word."""
        x = x + 0.0  # -0.0 + 0.0 is +0.0 (round to nearest): one add
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
    def _least(best, k, K_PAD: tl.constexpr):
        """The least of the first ``k`` keys held: the ``k``-th best (``KEY_FLOOR`` and up
        until ``k`` slots hold values)."""
        return tl.min(tl.where(tl.arange(0, K_PAD) < k, best, KEY_CEILING), axis=0)

    @triton.jit
    def _value(ordered):
        """The fp32 value of an ordered value (:func:`_ordered`): NaN for ``ORDERED_FLOOR``."""
        bits = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _packed(x, offsets, inside, MASKED: tl.constexpr):
        """int32 keys of a tile of 16-bit floats read as fp32 ``x`` (the bits of ``LOW_MASK``
        are 0 in their fp32 form): the ordered value's high bits (:func:`_ordered`; its low
        bits all 0 or all 1, so they order alike without them) above the complement of the
        offset in the tile; ``ORDERED_FLOOR`` where masked. Unique in a tile; ordering as the int64
        keys of :func:`_keys` do."""
        keys = (_ordered(x) & HIGH_MASK) | (offsets ^ LOW_MASK)
        if MASKED:
            keys = tl.where(inside, keys, ORDERED_FLOOR)
        return keys

    @triton.jit
    def _unpacked(key, base):
        """The int64 key (:func:`_keys`) of a packed one (:func:`_packed`) of the tile whose
        offset 0 is token ``base``."""
        high = key & HIGH_MASK
        ordered = tl.where(high < 0, high | LOW_MASK, high)
        return _keys(ordered, ((key & LOW_MASK) ^ LOW_MASK) + base)

    @triton.jit
    def _held(best, k, K_PAD: tl.constexpr):
        """A list of keys as the walk holds it: a small top-K's (``K_PAD <= CANDIDATES``) with
        its slots from ``k`` on at ``KEY_CEILING``, never its least (:func:`_insert`)."""
        if K_PAD <= CANDIDATES:
            best = tl.where(tl.arange(0, K_PAD) < k, best, KEY_CEILING)
        return best

    @triton.jit
    def _insert(best, least, key):
        """An unsorted list of keys (:func:`_held`) with ``key`` in the place of its least
        (keys are unique: one slot holds it), and its new least."""
        best = tl.where(best == least, key, best)
        return best, tl.min(best, axis=0)

    @triton.jit
    def _sorted_tile(x, ids, inside, K_PAD: tl.constexpr, MASKED: tl.constexpr):
        """A tile's best ``K_PAD`` keys, descending (masked lanes key as ``ORDERED_FLOOR``)."""
        ordered = _ordered(x)
        if MASKED:
            ordered = tl.where(inside, ordered, ORDERED_FLOOR)
        return tl.topk(_keys(ordered, ids), K_PAD)

    @triton.jit
    def _insert_each(x, top, base, ids, offsets, inside, best, least, K_PAD: tl.constexpr,
                     MASKED: tl.constexpr, PACKED: tl.constexpr):
        """Small top-K (``K_PAD <= CANDIDATES``): the tile's values (``top`` its max) enter the
        unsorted list ``best`` one by one, the highest first (ties: the lowest id), each in the
        place of the least held, while one is above it. Where ``PACKED`` (16-bit logits), each
        is the greatest int32 key (:func:`_packed`) below the last; else the greatest value at
        its lowest id (``ids``: :func:`_enter`'s), then removed (``-inf``): never above the
        least held, as the first ``k`` taken into an empty list are finite (:func:`_enter`
        sorts a tile with fewer) and a held ``-inf`` has a lower id."""
        if PACKED:
            keys = _packed(x, offsets, inside, MASKED)
            key = tl.max(keys, axis=0)
            candidate = _unpacked(key, base)
            while candidate > least:
                best, least = _insert(best, least, candidate)
                key = tl.max(tl.where(keys < key, keys, ORDERED_FLOOR), axis=0)
                candidate = _unpacked(key, base)
        else:
            id = tl.min(tl.where(x == top, ids, ID_LIMIT), axis=0)
            candidate = _keys(_ordered(top), id)
            while candidate > least:
                best, least = _insert(best, least, candidate)
                x = tl.where(ids == id, float("-inf"), x)
                top = tl.max(x, axis=0)
                id = tl.min(tl.where(x == top, ids, ID_LIMIT), axis=0)
                candidate = _keys(_ordered(top), id)
        return best, least

    @triton.jit
    def _enter(x, top, base, offsets, inside, best, least, k, K_PAD: tl.constexpr,
               MASKED: tl.constexpr, PACKED: tl.constexpr):
        """The keys held and their least after a tile's values ``x`` (``-inf`` where masked;
        ``top`` their max; offset 0 is token ``base``) enter them. A masked lane takes an id
        above every token's, its own (``ID_LIMIT - 8 - base - offset``: a cut first tile's
        may lie before token 0): its ``-inf`` ranks below every real one. Until ``k`` keys
        are held, a tile with fewer than ``k`` finite values sorts its top ``K_PAD`` and
        merges it into the list (floors, and a cut first tile's keys). A small top-K's list
        is unsorted (:func:`_insert_each`); a wide one's is descending: the candidates (the
        values above the least held) give their best ``k`` one by one, highest first (ties:
        the lowest id), into a descending list merged once, where that is at most
        ``CANDIDATES`` passes; else the tile's sorted top ``K_PAD`` is merged. A candidate is
        finite: a value taken becomes ``-inf``."""
        ids = base + offsets
        if MASKED:
            ids = tl.where(inside, ids, ID_LIMIT - 8 - ids)
        kth = (least >> 32).to(tl.int32)
        empty = kth == ORDERED_FLOOR
        floor = tl.where(empty, float("-inf"), _value(kth))
        few = tl.full((), 0, tl.int1)
        if empty:
            few = tl.sum((x > floor).to(tl.int32), axis=0) < k
        if few:
            held = best
            if K_PAD <= CANDIDATES:  # unsorted: its slots from k on at KEY_CEILING
                held = tl.sort(tl.where(tl.arange(0, K_PAD) < k, best, KEY_FLOOR),
                               descending=True)
            best = _held(_merge(held, _sorted_tile(x, ids, inside, K_PAD, MASKED)), k, K_PAD)
            least = _least(best, k, K_PAD)
        elif K_PAD <= CANDIDATES:
            best, least = _insert_each(x, top, base, ids, offsets, inside, best, least, K_PAD,
                                       MASKED, PACKED)
        else:
            takes = tl.minimum(tl.sum((x > floor).to(tl.int32), axis=0), k)
            if takes > CANDIDATES:
                tile_best = _sorted_tile(x, ids, inside, K_PAD, MASKED)
            else:
                slots = tl.arange(0, K_PAD)
                tile_best = tl.full((K_PAD,), KEY_FLOOR, tl.int64)
                for slot in range(0, takes):
                    top = tl.max(x, axis=0)
                    id = tl.min(tl.where(x == top, ids, ID_LIMIT), axis=0)
                    tile_best = tl.where(slots == slot, _keys(_ordered(top), id), tile_best)
                    x = tl.where(ids == id, float("-inf"), x)
            best = _merge(best, tile_best)
            least = _least(best, k, K_PAD)
        return best, least

    @triton.jit
    def _walk_tile(x, tile, offsets, low, stop, first_id, target, m, s, counts, best, least,
                   k, K_PAD: tl.constexpr, TOPK: tl.constexpr, HAS_TARGET: tl.constexpr,
                   MASKED: tl.constexpr, PACKED: tl.constexpr):
        """One tile (fp32 ``x`` at columns ``tile + offsets``, column ``c`` token
        ``first_id + c``; ``-inf`` outside ``[low, stop)`` where ``MASKED``) folded into the
        walk's state: the running max ``m``, per-lane sums of exponentials rescaled to it
        ``s``, per-lane counts (``>=`` the target in the low 16 bits, ``==`` it above; only on
        a tile whose max reaches the target, the others add nothing), the best keys and the
        least of them (:func:`_least`)."""
        top = tl.max(x, axis=0)  # the one cross-warp step of a tile that enters nothing
        m_new = tl.maximum(m, top)
        scaled = tl.where(m_new == float("-inf"), 0.0, m_new) * LOG2E
        s = s * tl.exp2(m * LOG2E - scaled) + tl.exp2(x * LOG2E - scaled)
        columns = tile + offsets
        inside = (columns >= low) & (columns < stop)
        if HAS_TARGET:
            if top >= target:  # else no value of the tile is at or above the target's
                counted = tl.where(x >= target, tl.where(x == target, 65537, 1), 0)
                if MASKED:
                    counted = tl.where(inside, counted, 0)
                counts += counted
        if TOPK:
            if _ordered(top) > (least >> 32).to(tl.int32):  # no key before this passes
                best, least = _enter(x, top, tile + first_id, offsets, inside, best, least, k,
                                     K_PAD, MASKED, PACKED)
        return m_new, s, counts, best, least

    @triton.jit
    def _tile_state(x_ptr, lead, start, stop, target, first_id, k, BLOCK: tl.constexpr,
                    K_PAD: tl.constexpr, TOPK: tl.constexpr, HAS_TARGET: tl.constexpr,
                    LEAD: tl.constexpr):
        """Walk columns ``[start, stop)`` of one row, whose column ``c`` is token
        ``first_id + c`` and lies at ``x_ptr + lead + c`` (``x_ptr`` 16-byte aligned, ``start``
        a multiple of ``BLOCK``; ``lead`` 0 unless ``LEAD``), for its top ``k``: (max,
        rescaled sum, best keys descending, count of logits ``>=`` the target's, count equal
        to it). Tiles are aligned at ``x_ptr``, ``BLOCK`` apart from ``start``: the one
        holding the first column, where ``lead`` cuts it, is walked masked; the full ones
        load unmasked through Triton's software pipeline (``num_stages`` ``STAGES``: on sm_80
        and sm_90, 16-byte copies into shared memory issued ``STAGES - 1`` tiles ahead of the
        one walked, holding no registers, whatever the row's stride); a ragged last one is
        walked masked. Tiles
        come in order of their ids, so a later value equal to the ``k``-th key held has a
        higher id, a lower key: only a value above it can enter. The sums and counts are
        kept per lane and reduced once at the end; the keys start as distinct floors,
        descending; a small top-K's list, unsorted as it is walked (:func:`_insert_each`), is
        sorted once at the end."""
        PACKED: tl.constexpr = (x_ptr.dtype.element_ty.primitive_bitwidth == 16
                                and BLOCK <= LOW_MASK + 1)
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK,), tl.float32)
        counts = tl.zeros((BLOCK,), tl.int32)
        slots = tl.arange(0, K_PAD)
        best = _held(KEY_FLOOR + (K_PAD - 1 - slots).to(tl.int64), k, K_PAD)
        least = _least(best, k, K_PAD)
        offsets = tl.arange(0, BLOCK)
        low, high = start + lead, stop + lead  # the walk's columns from x_ptr
        first = start  # the first full tile
        if LEAD:
            cut = lead % BLOCK
            if cut > 0:  # the tile holding column low, cut there
                columns = low - cut + offsets
                x = tl.load(x_ptr + columns, mask=(columns >= low) & (columns < high),
                            other=float("-inf")).to(tl.float32)
                m, s, counts, best, least = _walk_tile(x, low - cut, offsets, low, high,
                                                       first_id - lead, target, m, s, counts,
                                                       best, least, k, K_PAD, TOPK,
                                                       HAS_TARGET, True, PACKED)
            # past it, as arithmetic (start plus whole tiles) the compiler sees aligned
            first = start + (lead // BLOCK + (cut > 0).to(tl.int32)) * BLOCK
        full_stop = first + tl.maximum(high - first, 0) // BLOCK * BLOCK
        for tile in tl.range(first, full_stop, BLOCK, num_stages=STAGES):
            x = tl.load(x_ptr + tile + offsets).to(tl.float32)
            m, s, counts, best, least = _walk_tile(x, tile, offsets, low, high, first_id - lead,
                                                   target, m, s, counts, best, least, k, K_PAD,
                                                   TOPK, HAS_TARGET, False, PACKED)
        if full_stop < high:
            columns = full_stop + offsets
            x = tl.load(x_ptr + columns, mask=columns < high, other=float("-inf"))
            m, s, counts, best, least = _walk_tile(x.to(tl.float32), full_stop, offsets, low,
                                                   high, first_id - lead, target, m, s, counts,
                                                   best, least, k, K_PAD, TOPK, HAS_TARGET,
                                                   True, PACKED)
        if TOPK and K_PAD <= CANDIDATES:
            best = tl.sort(tl.where(slots < k, best, KEY_FLOOR), descending=True)
        return (m, tl.sum(s, axis=0), best, tl.sum(counts & 0xFFFF, axis=0),
                tl.sum(counts >> 16, axis=0))

    @triton.jit
    def _row_start(x_ptr, row, stride_row, origin, LEAD: tl.constexpr):
        """The 16-byte aligned address at or below row ``row``'s first logit (at ``x_ptr +
        origin + row * stride_row``, ``x_ptr`` 16-byte aligned), and how many logits it lies
        before that one; the row's own address and 0 where its stride keeps it aligned and
        its origin is 0 (not ``LEAD``: ``origin``, not specialised, is then left out, so the
        compiler sees the address as aligned as ``stride_row`` is)."""
        at = row * stride_row
        lead = tl.zeros((), tl.int32)
        if LEAD:
            at += origin
            ALIGN: tl.constexpr = 128 // x_ptr.dtype.element_ty.primitive_bitwidth
            aligned = at // ALIGN * ALIGN  # a multiple of ALIGN the compiler sees
            lead = (at - aligned).to(tl.int32)
            at = aligned
        return x_ptr + at, lead

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
    def _slice_keys(part_keys_ptr, first, at, parts, K_PAD: tl.constexpr):
        """The keys slice ``at`` of the row whose first slice is ``first`` wrote, descending
        (all ``KEY_FLOOR`` for a slice past ``parts``), read past L1 (``.cg``: another
        program wrote them)."""
        slots = tl.arange(0, K_PAD)
        return tl.load(part_keys_ptr + (first + at) * K_PAD + slots,
                       mask=at + slots * 0 < parts, other=KEY_FLOOR, cache_modifier=".cg")

    @triton.jit
    def _tree_best(keys, GROUP: tl.constexpr, K_PAD: tl.constexpr):
        """The best ``K_PAD`` keys, descending, of ``GROUP`` lists of ``K_PAD`` (rows of
        ``keys``: each even one descending, each odd one ascending; both sizes powers of two,
        ``GROUP`` above 2: :func:`stagelab.core.launches.merge_tree`), merged in pairs as a
        tree, no list sorted again: a pair's greater keys slot by slot are a bitonic list of
        its best ``K_PAD`` (repeats counted), which each level's bitonic merge (``log2
        K_PAD`` compare stages) puts in the order its next pair needs (even rows descending,
        odd ascending), the last descending."""
        tl.static_assert(GROUP > 2, "a group of one or two slices is merged, not a tree")
        LEVELS: tl.constexpr = GROUP.bit_length() - 1
        best = tl.max(tl.reshape(keys, (GROUP // 2, 2, K_PAD)), axis=1)
        for level in tl.static_range(2, LEVELS + 1):
            even, odd = tl.split(tl.permute(tl.reshape(best, (GROUP >> level, 2, K_PAD)),
                                            (0, 2, 1)))
            best = tl.maximum(tl.bitonic_merge(even, descending=True),
                              tl.bitonic_merge(odd, descending=False))
        return tl.bitonic_merge(tl.reshape(best, (K_PAD,)), descending=True)

    @triton.jit
    def _group_best(part_keys_ptr, first, lead, parts, GROUP: tl.constexpr,
                    K_PAD: tl.constexpr, MERGE_TREE: tl.constexpr):
        """The best ``K_PAD`` keys, descending, of slices ``lead`` to ``lead + GROUP`` of the
        row whose first slice is ``first`` (a slice past ``parts`` holds none). Each slice
        wrote its keys descending: one list is its own best, two are merged (:func:`_merge`,
        no sort); more are read as one and, with ``MERGE_TREE``, the odd slices' in reverse,
        merged as a tree (:func:`_tree_best`), else their top ``K_PAD`` taken (``tl.topk``,
        which sorts each list again) (:func:`stagelab.core.launches.merge_tree`)."""
        if GROUP == 1:
            best = _slice_keys(part_keys_ptr, first, lead, parts, K_PAD)
        elif GROUP == 2:
            best = _merge(_slice_keys(part_keys_ptr, first, lead, parts, K_PAD),
                          _slice_keys(part_keys_ptr, first, lead + 1, parts, K_PAD))
        else:
            group = tl.arange(0, GROUP)
            if MERGE_TREE:  # an odd slice's keys ascending (reversed: 8 bytes a load)
                slots = tl.arange(0, K_PAD)[None, :]
                slots = tl.where((group % 2 == 1)[:, None], K_PAD - 1 - slots, slots)
                keys = tl.load(part_keys_ptr + (first + lead + group)[:, None] * K_PAD + slots,
                               mask=(lead + group < parts)[:, None], other=KEY_FLOOR,
                               cache_modifier=".cg")
                best = _tree_best(keys, GROUP, K_PAD)
            else:
                keys = tl.load(part_keys_ptr + (first + lead + group)[:, None] * K_PAD
                               + tl.arange(0, K_PAD)[None, :],
                               mask=(lead + group < parts)[:, None], other=KEY_FLOOR,
                               cache_modifier=".cg")
                best = tl.topk(tl.reshape(keys, (GROUP * K_PAD,)), K_PAD)
        return best

    @triton.jit
    def _record(m, s, ge, eq):
        """A slice's scalars as one record of four int32 (``m`` and ``s`` as their bits):
        stored by one instruction, read back with every slice's in one load of 16 bytes a
        slice (:func:`_merged_slices`)."""
        field = tl.arange(0, 4)
        return tl.where(field == 0, m.to(tl.int32, bitcast=True),
                        tl.where(field == 1, s.to(tl.int32, bitcast=True),
                                 tl.where(field == 2, ge, eq)))

    @triton.jit
    def _merged_slices(row, parts, part_state_ptr, part_keys_ptr, K_PAD: tl.constexpr,
                       TOPK: tl.constexpr, GROUP: tl.constexpr, SLICES: tl.constexpr,
                       MERGE_TREE: tl.constexpr):
        """Row ``row``'s state from its ``parts`` slices' partial states, read past L1
        (``.cg``: other programs wrote them): every slice's record of scalars (:func:`_record`)
        in one load, the first ``GROUP`` slices' keys beside it, both issued before anything
        waits on either (so they share one round trip), any later group's a read each
        (:func:`stagelab.core.launches.merge_group`), its best (:func:`_group_best`) merged
        into the row's. The records are ``SLICES`` (``parts`` padded to a power of two) by
        four: a few slices' are reduced within a warp, with no barrier."""
        first = row * parts
        slices = tl.arange(0, SLICES)
        held = slices < parts
        records = tl.load(part_state_ptr + (first + slices)[:, None] * 4
                          + tl.arange(0, 4)[None, :], mask=held[:, None], other=0,
                          cache_modifier=".cg")
        best = tl.full((K_PAD,), KEY_FLOOR, tl.int64)
        if TOPK:
            best = _group_best(part_keys_ptr, first, 0, parts, GROUP, K_PAD, MERGE_TREE)
        m_and_ge, s_and_eq = tl.split(tl.reshape(records, (SLICES, 2, 2)))
        m_bits, ges = tl.split(m_and_ge)
        s_bits, eqs = tl.split(s_and_eq)
        ms = tl.where(held, m_bits.to(tl.float32, bitcast=True), float("-inf"))
        ss = s_bits.to(tl.float32, bitcast=True)
        m = tl.max(ms, axis=0)
        safe = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(ss * tl.exp(ms - safe), axis=0)
        ge = tl.sum(ges, axis=0)
        eq = tl.sum(eqs, axis=0)
        if TOPK:
            for lead in range(GROUP, parts, GROUP):
                best = _merge(best, _group_best(part_keys_ptr, first, lead, parts, GROUP,
                                                K_PAD, MERGE_TREE))
        return m, s, best, ge, eq

    # ``origin`` (0 but for logits that start off alignment:
    # :func:`stagelab.measure.onepass.aligned_logits`) takes any value without a
    # specialisation of its own (not even on its divisibility): only ``LEAD`` walks add it.
    @triton.jit(do_not_specialize=["origin"])
    def onepass_kernel(x_ptr, stride_row, origin, vocab, targets_ptr, values_ptr, ids_ptr,
                       lse_ptr, target_lp_ptr, rank_ptr, ties_ptr, part_state_ptr,
                       part_keys_ptr, arrivals_ptr, k, span,
                       BLOCK: tl.constexpr, K_PAD: tl.constexpr, TOPK: tl.constexpr,
                       HAS_TARGET: tl.constexpr, SPLIT: tl.constexpr, LEAD: tl.constexpr,
                       GROUP: tl.constexpr, SLICES: tl.constexpr,
                       MERGE_TREE: tl.constexpr = False):
        """Program ``(row, slice)``: the slice ``[slice * span, (slice + 1) * span)`` of a row
        (at ``x_ptr + origin + row * stride_row``), whose results it writes; with ``SPLIT`` it
        writes its partial state and counts itself in ``arrivals_ptr[row]``, and the row's
        last slice to end merges them all (:func:`_merged_slices`: ``GROUP`` slices' keys a
        read, the scalars ``SLICES`` records, its slices padded to a power of two),
        writes the row's results and sets the count back to 0 (so the counts, zeros, serve
        the next call as they were); ``LEAD`` where the rows' stride or origin leaves some
        unaligned (:func:`_row_start`); ``MERGE_TREE`` (:func:`_group_best`) given only where
        set, so that the variants it leaves keep their specialisation."""
        row = tl.program_id(0).to(tl.int64)
        part = tl.program_id(1)
        parts = tl.num_programs(1)
        x_row = x_ptr + origin + row * stride_row
        target = 0.0
        if HAS_TARGET:
            target = tl.load(x_row + tl.load(targets_ptr + row)).to(tl.float32)
        start = part * span
        stop = tl.minimum(start + span, vocab)
        aligned, lead = _row_start(x_ptr, row, stride_row, origin, LEAD)
        m, s, best, ge, eq = _tile_state(aligned, lead, start, stop, target, 0, k, BLOCK, K_PAD,
                                         TOPK, HAS_TARGET, LEAD)
        if SPLIT:
            at = row * parts + part
            tl.store(part_state_ptr + at * 4 + tl.arange(0, 4), _record(m, s, ge, eq))
            if TOPK:
                tl.store(part_keys_ptr + at * K_PAD + tl.arange(0, K_PAD), best)
            tl.debug_barrier()  # every lane's share of the state stored before it is counted
            arrived = tl.atomic_add(arrivals_ptr + row, 1, sem="acq_rel", scope="gpu")
            if arrived == parts - 1:  # the row's last slice to end
                tl.store(arrivals_ptr + row, 0)
                row_m, row_s, row_best, row_ge, row_eq = _merged_slices(
                    row, parts, part_state_ptr, part_keys_ptr, K_PAD, TOPK, GROUP, SLICES,
                    MERGE_TREE)
                _finish(row, row_m, row_s, row_best, row_ge, row_eq, target, values_ptr,
                        ids_ptr, lse_ptr, target_lp_ptr, rank_ptr, ties_ptr, k, K_PAD, TOPK,
                        HAS_TARGET)
        else:
            _finish(row, m, s, best, ge, eq, target, values_ptr, ids_ptr, lse_ptr,
                    target_lp_ptr, rank_ptr, ties_ptr, k, K_PAD, TOPK, HAS_TARGET)

    @triton.jit(do_not_specialize=["origin"])
    def fold_kernel(x_ptr, stride_row, origin, width, first_id, target_ptr, state_m_ptr,
                    state_s_ptr, state_keys_ptr, state_ge_ptr, state_eq_ptr, k,
                    BLOCK: tl.constexpr,
                    K_PAD: tl.constexpr, TOPK: tl.constexpr, HAS_TARGET: tl.constexpr,
                    LEAD: tl.constexpr):
        """Program ``row``: the state of its tile of logits ``[0, width)`` (tokens ``first_id``
        on, at ``x_ptr + origin + row * stride_row``), merged into the row's running state in
        place, as the split variant's merge does; ``LEAD`` as :func:`onepass_kernel`'s."""
        row = tl.program_id(0).to(tl.int64)
        target = 0.0
        if HAS_TARGET:
            target = tl.load(target_ptr + row)
        aligned, lead = _row_start(x_ptr, row, stride_row, origin, LEAD)
        m, s, best, ge, eq = _tile_state(aligned, lead, 0, width, target, first_id, k, BLOCK,
                                         K_PAD, TOPK, HAS_TARGET, LEAD)
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
