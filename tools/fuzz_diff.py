"""Differential fuzzing campaign: random RV64IMAC programs (tests/progen.py) on the translated code against the
reference interpreter, for a time budget. Each round draws ``--batch`` programs from one seed, optionally mutates
their code (``--mutate``: random halfwords overwritten, which makes wild jumps, jumps into the middle of
instructions, illegal encodings, loops without back-edges) and their legal indirect targets (``--targets``),
translates the whole batch into one shared object (one
compile) and compares every program's end state: registers, pc, trap, failure, data and stack memory. Each program
runs twice on the translated code (the second run also checks the memory reset). Runs the deadline interrupted
are not compared (docs/SEMANTICS.md). Rounds of odd seeds draw programs whose functions also call themselves.

    python tools/fuzz_diff.py --minutes 5
    python tools/fuzz_diff.py --seed 1234 --rounds 1 --verbose    # replay one round
    python tools/fuzz_diff.py --minutes 5 --dump cases/           # also save each finding's program ...
    python tools/fuzz_diff.py --replay cases/seed1234-p7.pickle   # ... and run it alone on both engines
    python tools/fuzz_diff.py --minutes 5 --every-group-fails     # every group's slow path: the checked runner
    python tools/fuzz_diff.py --minutes 5 --chunks 4              # every function in chunks of at most 4

A dumped case is a pickle of the generated program (image, entry, snapshot ranges, listing): load only files this
tool wrote. Replaying one is how to debug it (it is built, translated and compared exactly as in its round), and
its listing is what a regression test in tests/test_aot_diff.py is written from.
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import random
import re
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from fuzz_common import Campaign, campaign_args, draw_examples

from berm_abi.errors import BermError
from berm_aot.image import Relocation
from berm_aot.program import Program
from berm_host.aot.backend import AotBackend
from berm_host.aot.objects import compile_programs
from berm_host.layout import layout_for
from berm_host.backend import RunRequest
from berm_host.interp import InterpBackend
from berm_host.traps import TrapKind
from tests import progen
from tests.test_aot_diff import assert_same
from tests.test_aot_chunks import in_chunks
from tests.test_aot_slowrun import every_group_fails

DEADLINE = 0.5


def mutate(gen: progen.GenProgram, rng: random.Random, edits: int, targets: int) -> progen.GenProgram:
    """``gen`` with ``edits`` random halfwords of its text overwritten and ``targets`` random text addresses made
    legal indirect targets (an ``R_RISCV_64`` naming each, as a jump table would); the listing notes both."""
    text = gen.image.segments[0]
    code = bytearray(text.data)
    notes = []
    for _ in range(edits):
        at = rng.randrange(0, len(code) - 1) & ~1
        word = rng.getrandbits(16)
        code[at:at + 2] = word.to_bytes(2, "little")
        notes.append(f"{progen.TEXT + at:#x}={word:04x}")
    extra = []
    for _ in range(targets):
        target = progen.TEXT + (rng.randrange(0, len(code)) & ~1)
        extra.append(Relocation(progen.RODATA, progen.R_RISCV_64, "R_RISCV_64", ".text", progen.TEXT,
                                target - progen.TEXT, ".rodata"))
        notes.append(f"target {target:#x}")
    segments = (replace(text, data=bytes(code)),) + gen.image.segments[1:]
    raw = gen.image.raw + repr(notes).encode()
    image = replace(gen.image, segments=segments, relocations=gen.image.relocations + tuple(extra), raw=raw,
                    sha256=hashlib.sha256(raw).hexdigest())
    return progen.GenProgram(image, gen.entry, gen.listing + "\nmutated: " + " ".join(notes))


def dump(directory: Path, seed_value: int, index: int, gen: progen.GenProgram) -> Path:
    """Save ``gen`` for ``--replay``; returns the file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"seed{seed_value}-p{index}.pickle"
    path.write_bytes(pickle.dumps((gen.image, gen.entry, gen.listing)))
    return path


def replay(path: Path) -> int:
    """Run one dumped program on both engines, as a round does; exit status 1 when they differ."""
    image, entry, listing = pickle.loads(path.read_bytes())
    gen = progen.GenProgram(image, entry, listing)
    program = Program.from_image(image)
    windows = layout_for(image, progen.MEMORY_SIZE).windows()
    with tempfile.TemporaryDirectory(prefix="berm-fuzz-replay-") as tmp:
        so = Path(tmp) / "case.so"
        compile_programs([(program, windows, "")], so)
        request = RunRequest(entry=entry, snapshot=gen.snapshot, deadline=time.monotonic() + DEADLINE)
        expected = InterpBackend(program, progen.MEMORY_SIZE).run(request)
        got = AotBackend(program, progen.MEMORY_SIZE, code=(so, "")).run(
            RunRequest(entry=entry, snapshot=gen.snapshot, deadline=time.monotonic() + DEADLINE))
    print(f"interpreter: {expected.trap or 'returned'}\ntranslated:  {got.trap or 'returned'}")
    try:
        assert_same(gen, expected, got)
    except AssertionError as exc:
        print(f"differ: {exc}")
        return 1
    print("same end state")
    return 0


def run_round(campaign: Campaign, seed_value: int, batch: int, edits: int, targets: int, verbose: bool,
              dump_dir: Path | None = None) -> None:
    gens = draw_examples(progen.programs(self_calls=seed_value % 2 == 1), batch, seed_value)
    rng = random.Random(seed_value)
    if edits or targets:
        gens = [mutate(g, rng, rng.randint(min(1, edits), edits), rng.randint(0, targets)) for g in gens]
    kept: list[tuple[progen.GenProgram, Program]] = []
    for g in gens:
        try:
            kept.append((g, Program.from_image(g.image)))
        except BermError:
            continue  # a mutation reached an F/D/CSR encoding: refused at load, as it should be
        except Exception as exc:  # noqa: BLE001 - a raw exception from the loader is a finding
            campaign.finding(seed_value, f"Program.from_image raised {type(exc).__name__}: {exc}\n{g.listing}")
    with tempfile.TemporaryDirectory(prefix="berm-fuzz-diff-") as tmp:
        so = Path(tmp) / "batch.so"
        try:
            compile_programs([(p, layout_for(p.image, progen.MEMORY_SIZE).windows(), f"p{i}_")
                              for i, (_, p) in enumerate(kept)], so)
        except Exception as exc:  # noqa: BLE001 - the translator produced C that does not compile
            # the compiler's message names the failing functions by their program's prefix (p<i>_)
            named = sorted({int(i) for i in re.findall(r"\bp(\d+)_", str(exc)) if int(i) < len(kept)})
            saved = "".join(f"\n(saved: {dump(dump_dir, seed_value, i, kept[i][0])})"
                            for i in named) if dump_dir else ""
            campaign.finding(seed_value, f"batch of {len(kept)} failed to compile: {type(exc).__name__}: "
                             f"{str(exc)[:2000]}{saved}")
            return
        for i, (gen, program) in enumerate(kept):
            campaign.cases += 1
            deadline = time.monotonic() + DEADLINE
            expected = InterpBackend(program, progen.MEMORY_SIZE).run(
                RunRequest(entry=gen.entry, snapshot=gen.snapshot, deadline=deadline))
            aot = AotBackend(program, progen.MEMORY_SIZE, code=(so, f"p{i}_"))
            for attempt in range(2):
                got = aot.run(RunRequest(entry=gen.entry, snapshot=gen.snapshot,
                                         deadline=time.monotonic() + DEADLINE))
                interrupted = TrapKind.INTERRUPTED in (getattr(got.trap, "kind", None),
                                                       getattr(expected.trap, "kind", None))
                if interrupted:
                    break
                try:
                    assert_same(gen, expected, got)
                except AssertionError as exc:
                    saved = f" (saved: {dump(dump_dir, seed_value, i, gen)})" if dump_dir else ""
                    campaign.finding(seed_value, f"program {i}, run {attempt + 1}{saved}: {exc}")
                    break
            if verbose:
                print(f"  program {i}: {expected.trap or 'returned'}", flush=True)


def main() -> int:
    p = campaign_args(__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=60, help="programs per compiled object (default %(default)s)")
    p.add_argument("--mutate", type=int, default=0, metavar="N",
                   help="overwrite 1..N random halfwords of each program's code (default: no mutation)")
    p.add_argument("--targets", type=int, default=0, metavar="N",
                   help="make 0..N random text addresses legal indirect targets (default: none)")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--dump", type=Path, metavar="DIR", help="save each finding's program in DIR (for --replay)")
    p.add_argument("--replay", type=Path, metavar="FILE", help="run one saved program on both engines, and stop")
    p.add_argument("--every-group-fails", action="store_true",
                   help="translate so that every group of accesses fails its check and runs on the checked runner "
                        "(berm_aot/emit/slowrun.py), its rarely taken slow path")
    p.add_argument("--chunks", type=int, default=0, metavar="N",
                   help="translate every function of more than N instructions in chunks of at most N "
                        "(berm_aot/emit/chunks.py; default: only the functions too large for one C function)")
    args = p.parse_args()
    with (every_group_fails() if args.every_group_fails else contextlib.nullcontext(),
          in_chunks(args.chunks, args.chunks) if args.chunks else contextlib.nullcontext()):
        if args.replay:
            return replay(args.replay)
        campaign = Campaign("fuzz_diff", args)
        for s in campaign.seeds():
            print(f"[fuzz_diff] round seed {s}", flush=True)
            run_round(campaign, s, args.batch, args.mutate, args.targets, args.verbose, args.dump)
        return campaign.summary()


if __name__ == "__main__":
    raise SystemExit(main())
