"""The one-pass kernel against its torch reference on the lease's GPU, in one line.

Plain Python (the lease image has torch and Triton, no pytest): on each of :data:`SHAPES`
the Triton backend of :func:`stagelab.measure.onepass.topk_logprobs` (its own plan, the same
call again on the arrival counts the first left, and rows forced into :data:`SPLITS` slices,
whose last slice merges them) and the head-fused fold
(:class:`stagelab.measure.onepass.TileFold`) must give the torch backend's ids, ranks and tie
counts exactly and its logprobs within 1e-4, and no arrival count may be left nonzero. Prints
one line, ``kernel check: ok ...`` or ``kernel check: FAILED ...`` (naming each call that
differs or raises, with its plan), and exits 0 or 1; run it first in a lease command:

    PYTHONPATH=lib python3 scripts/lease_kernel_check.py && PYTHONPATH=lib python3 -m stagelab ...

``--small`` takes small shapes and ``--device cpu`` Triton's interpreter (``TRITON_INTERPRET=1``
set before Triton is imported): how the tests rehearse it without a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time

# (rows, vocabulary, k, dtype): decode at n = 1 (four-warp programs, split); batches at
# n = 64 without a top-K (one-warp programs, 33 slices: launches.narrow_walk), at n = 16,
# k = 20 (one-warp programs, 16 slices, whose keys the row's last merges in two groups) and
# at n = 256, k = 20 (one-warp programs, 6 slices); GPT-2's 1000 rows at k = 20 (one-warp
# programs, whole rows, most of them off 16 bytes: each walked from an aligned address); a
# large vocabulary at n = 256 with the largest top-K (eight-warp programs, unsplit); each
# forced into SPLITS slices too (four warps); small ones for the interpreter.
SHAPES = ((1, 152064, 5, "bfloat16"), (64, 152064, 0, "float32"), (16, 152064, 20, "bfloat16"),
          (256, 152064, 20, "float32"), (1000, 50257, 20, "bfloat16"),
          (256, 262144, 1024, "bfloat16"))
SMALL = ((1, 3000, 5, "bfloat16"), (4, 1500, 20, "float32"), (3, 2500, 64, "float16"))
TOLERANCE = 1e-4
FOLD_TILE = 1024
SPLITS = 8  # slices forced on every row: at k = 1024 each slice's keys are merged on their own
# The Triton calls of a shape: its own plan, the same again, and its rows split.
CALLS = (("", {}), ("again", {}), (f"split {SPLITS}", dict(splits=SPLITS)))


def compare(mine, reference) -> list[str]:
    """What differs between two OnePass results (empty where they agree)."""
    import torch

    wrong = [name for name in ("ids", "target_rank", "target_ties")
             if not torch.equal(getattr(mine, name), getattr(reference, name))]
    for name in ("values", "logsumexp", "target_logprob"):
        got, want = getattr(mine, name), getattr(reference, name)
        if not torch.allclose(got, want, rtol=0, atol=TOLERANCE, equal_nan=True):
            wrong.append(f"{name} (max diff {(got - want).abs().max().item():.2e})")
    return wrong


def reason(exc: BaseException) -> str:
    """An exception as one line: its type and its message's last non-empty line (a Triton
    compile error's cause comes last), or its type alone."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1][:200]}" if lines else type(exc).__name__


def plan(rows: int, vocab: int, k: int, tuning: dict, device: str) -> str:
    """The first launch the Triton backend plans for a call: its grid, warps and tile (or
    why it plans none)."""
    import torch

    from stagelab.core import launches
    from stagelab.measure import onepass

    try:
        first = launches.triton_launches(rows, vocab, k, True, None, tuning.get("splits"),
                                         onepass.program_slots(torch.device(device), k))[0]
    except Exception as exc:
        return f"plan refused: {reason(exc)}"
    return f"grid {first.grid}, {first.num_warps} warps, BLOCK {first.constexprs['BLOCK']}"


def folded(logits, k: int, targets):
    """The Triton fold of ``logits`` a tile at a time, as the head-fused method folds."""
    from stagelab.measure import onepass

    target = logits.gather(1, targets[:, None])[:, 0].float()
    fold = onepass.TileFold(logits.shape[0], k, target, logits.device, "triton")
    for start in range(0, logits.shape[1], FOLD_TILE):
        fold.add(logits[:, start:start + FOLD_TILE].contiguous(), start)
    return fold.finish()


def check_shape(rows: int, vocab: int, k: int, dtype: str, device: str) -> str:
    """``"<shape> ok"`` or ``"<shape> <what differs>"``."""
    import torch

    from stagelab.measure import onepass

    generator = torch.Generator(device=device).manual_seed(rows + vocab + k)
    logits = (3 * torch.randn(rows, vocab, device=device, generator=generator)).to(
        getattr(torch, dtype))
    targets = torch.randint(0, vocab, (rows,), device=device, generator=generator)
    shape = f"n={rows} V={vocab} k={k} {dtype}"
    try:
        reference = onepass.topk_logprobs(logits, k, targets, backend="torch")
    except Exception as exc:  # the shape cannot be checked; the others still are
        return f"{shape} torch raised {reason(exc)}"
    wrong = []
    for name, tuning in CALLS:
        call = f"{name or 'plan'} [{plan(rows, vocab, k, tuning, device)}]"
        try:  # a fault on the GPU surfaces at the comparison's first sync
            kernel = onepass.topk_logprobs(logits, k, targets, backend="triton", **tuning)
            if kernel.backend != "triton":
                wrong.append(f"{call} the triton backend did not run")
            wrong += [f"{call} {what}" for what in compare(kernel, reference)]
        except Exception as exc:
            wrong.append(f"{call} raised {reason(exc)}")
    try:
        wrong += [f"fold {w}" for w in compare(folded(logits, k, targets), reference)]
    except Exception as exc:
        wrong.append(f"fold raised {reason(exc)}")
    return f"{shape} ok" if not wrong else f"{shape} {', '.join(wrong)}"


def checked(shape: tuple, device: str) -> str:
    """:func:`check_shape`'s line, or the shape and why checking it raised."""
    rows, vocab, k, dtype = shape
    try:
        return check_shape(rows, vocab, k, dtype, device)
    except Exception as exc:
        return f"n={rows} V={vocab} k={k} {dtype} raised {reason(exc)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    try:
        import torch
        import triton

        if args.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        found = [checked(shape, args.device) for shape in (SMALL if args.small else SHAPES)]
        if args.device == "cuda":
            torch.cuda.synchronize()
        from stagelab.measure import onepass

        found += [f"arrival counts left nonzero on {where}"
                  for where in onepass.arrival_counts_left()]
    except Exception as exc:  # one line whatever happens: the lease's log is read at a glance
        print(f"kernel check: FAILED ({reason(exc)})")
        return 1
    bad = [line for line in found if not line.endswith(" ok")]
    where = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"kernel check: {'ok' if not bad else 'FAILED'} {len(found) - len(bad)}/{len(found)} "
          f"shapes, Triton {triton.__version__} against torch {torch.__version__} on {where} "
          f"({time.perf_counter() - began:.1f} s): " + "; ".join(bad or found))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
