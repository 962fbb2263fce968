"""ELF fuzzing campaign: valid harness images, mutated at random, against every loading step — ``read_elf``,
``load_manifest``, ``Program.from_image``, ``layout_for``, C emission, ``Engine.load`` on the interpreter and (for
every ``--aot-every``-th image that gets that far) on translated code, then a call of each declared tool. Only
a BermError may come out (a Trap or ToolFailure from a tool call is fine); a raw exception, a crash or a hang of
the child process is a finding.

Cases run in a child process (``--per-child`` at a time) so a crash or hang is caught and named by its seed and
case index; ``--seed S --case I --dump out.elf`` writes one mutated image for a reproduction.

    python tools/fuzz_elf.py --minutes 5
"""

from __future__ import annotations

import json
import random
import struct
import sys
import tempfile
from pathlib import Path

from fuzz_common import ROOT, Campaign, campaign_args

from tests.elf_samples import EHDR_FIELDS, PHDR_FIELDS, SHDR_FIELDS, dispatch_elf, phdr_offsets, shdr_offsets

_ODD = [0, 1, 2, 3, 7, 8, 0x40, 0x7F, 0xFF, 0xFFFF, 0x1000, 0x7FFF_FFFF, 0xFFFF_FFFF, 1 << 32, 1 << 60,
        (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def bases() -> list[bytes]:
    """The images mutated: a jump-table program, the red-team guest and the fixture harness."""
    from berm_sdk.build import build_harness
    from tests.test_redteam_guests import guest
    out = [dispatch_elf(), guest()]
    fixture = Path(tempfile.gettempdir()) / "berm-fuzz-elf-fixture.elf"
    if not fixture.exists():
        build_harness(ROOT / "harnesses" / "fixture", fixture)
    out.append(fixture.read_bytes())
    return out


def _header_fields(data: bytes) -> list[tuple[int, str]]:
    """(file offset, struct format) of every header field worth corrupting."""
    out = [(at, fmt) for at, fmt in EHDR_FIELDS.values()]
    for offsets, fields in ((phdr_offsets, PHDR_FIELDS), (lambda d: shdr_offsets(d).values(), SHDR_FIELDS)):
        try:
            bases = list(offsets(data))
        except Exception:  # noqa: BLE001 - an earlier mutation broke the tables (or cut the file): none to pick
            bases = []
        for base in bases:
            out += [(base + off, fmt) for off, fmt in fields.values()]
    return out


def _section_spans(data: bytes) -> list[tuple[str, int, int]]:
    """(name, first, end) file offsets of every non-empty section with contents in the file."""
    try:
        headers = shdr_offsets(data)
    except Exception:  # noqa: BLE001 - an earlier mutation broke the tables: no sections to pick
        return []
    out = []
    for name, base in headers.items():
        if base + 40 > len(data):
            continue
        off, size = struct.unpack_from("<Q", data, base + 24)[0], struct.unpack_from("<Q", data, base + 32)[0]
        kind = struct.unpack_from("<I", data, base + 4)[0]
        if kind != 8 and size and off + size <= len(data):  # 8: SHT_NOBITS
            out.append((name, off, off + size))
    return out


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One to three mutations of ``data``, and a note saying which."""
    out = bytearray(data)
    notes = []
    for _ in range(rng.randint(1, 3)):
        if len(out) < 16:
            break
        kind = rng.choice(["field", "field", "bytes", "block", "truncate", "word", "section", "section", "section"])
        if kind == "field":
            fields = _header_fields(bytes(out))
            at, fmt = rng.choice(fields)
            width = struct.calcsize(fmt)
            if at + width > len(out):
                continue
            value = rng.choice(_ODD + [rng.getrandbits(8 * width), len(out), len(out) - 1])
            struct.pack_into(fmt, out, at, value & ((1 << (8 * width)) - 1))
            notes.append(f"field@{at:#x}={value:#x}")
        elif kind == "bytes":
            for _ in range(rng.randint(1, 16)):
                at = rng.randrange(len(out))
                out[at] = rng.getrandbits(8)
            notes.append("bytes")
        elif kind == "block":
            at = rng.randrange(len(out))
            n = rng.randint(1, 256)
            out[at:at + n] = rng.randbytes(min(n, len(out) - at))
            notes.append(f"block@{at:#x}+{n}")
        elif kind == "word":  # a plausible value (an address, a size) dropped at an aligned offset
            at = rng.randrange(0, len(out) - 8) & ~7
            struct.pack_into("<Q", out, at, rng.choice(_ODD))
            notes.append(f"word@{at:#x}")
        elif kind == "section":  # inside one section's contents: code, jump tables, relocations, the manifest
            spans = _section_spans(bytes(out))
            if not spans:
                continue
            loaded = [sp for sp in spans if sp[0] in (".text", ".rodata", ".data", ".berm.abi")]
            name, lo, hi = rng.choice(loaded if loaded and rng.random() < 0.8 else spans)
            for _ in range(rng.randint(1, 8)):
                at = rng.randrange(lo, hi)
                out[at] = rng.getrandbits(8)
            notes.append(f"in {name}")
        else:
            n = rng.randrange(len(out))
            del out[n:]
            notes.append(f"truncate {n}")
    return bytes(out), " ".join(notes)


def case(bases_: list[bytes], seed_value: int, index: int) -> tuple[bytes, str]:
    rng = random.Random(seed_value * 1_000_003 + index)
    base = rng.randrange(len(bases_))
    data, note = mutate(bases_[base], rng)
    return data, f"base {base}: {note}"


# ---------------------------------------------------------------- the child


def _load_everything(data: bytes, aot: bool, cache_dir: Path) -> str:
    """Every loading step on ``data``; returns how far it got. Only BermError may escape."""
    from berm_aot.elf import read_elf
    from berm_aot.emit import emit_program
    from berm_aot.manifest import load_manifest
    from berm_aot.program import Program
    from berm_host.engine import Engine
    from berm_host.layout import layout_for

    image = read_elf(data)
    try:
        load_manifest(image)
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a BermError
        _only_berm(exc)
    program = Program.from_image(image)
    emit_program(program, windows=layout_for(image, 1 << 20).windows())
    kinds = ["interp", "aot"] if aot else ["interp"]
    for kind in kinds:
        loaded = Engine(kind=kind, memory_size=1 << 20, cache_dir=cache_dir, deadline=0.5).load(data)
        harness = loaded.harness()
        for tool in harness.tools:
            try:
                harness.call(tool, b'{"text": "x"}')
            except Exception as exc:  # noqa: BLE001
                _only_berm(exc)
    return "ran" if aot else "loaded"


def _only_berm(exc: BaseException) -> None:
    from berm_abi.errors import BermError
    if not isinstance(exc, BermError):
        raise exc


def child() -> None:
    from berm_abi.errors import BermError
    job = json.loads(sys.stdin.read())
    bases_ = bases()
    cache_dir = Path(job["cache_dir"])
    for index in range(job["first"], job["first"] + job["count"]):
        data, note = case(bases_, job["seed"], index)
        print(json.dumps({"start": index}), flush=True)
        try:
            how = _load_everything(data, index % job["aot_every"] == 0, cache_dir)
        except BermError as exc:
            how = f"refused: {type(exc).__name__}"
        except Exception as exc:  # noqa: BLE001 - the finding
            how = f"RAW {type(exc).__name__}: {str(exc)[:300]} ({note})"
        print(json.dumps({"done": index, "how": how}), flush=True)


CHILD = "import sys; sys.path.insert(0, 'tools'); import fuzz_elf; fuzz_elf.child()"


def main() -> int:
    p = campaign_args(__doc__.split("\n\n")[0])
    p.add_argument("--per-child", type=int, default=200, help="cases per child process (default %(default)s)")
    p.add_argument("--aot-every", type=int, default=25, help="translate and run every Nth case (default "
                   "%(default)s)")
    p.add_argument("--case", type=int, default=None, help="with --dump: the case index to write")
    p.add_argument("--dump", type=Path, default=None, help="write case --case of --seed to this file and stop")
    args = p.parse_args()
    if args.dump is not None:
        data, note = case(bases(), args.seed or 0, args.case or 0)
        args.dump.write_bytes(data)
        print(f"wrote {args.dump} ({note})")
        return 0
    campaign = Campaign("fuzz_elf", args)
    bases()  # build the fixture once, before the children need it
    outcomes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="berm-fuzz-elf-") as cache_dir:
        for s in campaign.seeds():
            job = {"seed": s, "first": 0, "count": args.per_child, "aot_every": args.aot_every,
                   "cache_dir": cache_dir}
            replay = " (replay: --seed {seed} --case {case} --dump x.elf)"
            for msg in campaign.child_round(s, CHILD, job, timeout=30 + args.per_child * 0.5, replay=replay):
                how = msg["how"]
                key = how.split(" (")[0] if how.startswith("RAW") else how
                outcomes[key] = outcomes.get(key, 0) + 1
                if how.startswith("RAW"):
                    campaign.finding(s, f"case {msg['done']}: {how}")
    return campaign.summary(outcomes)


if __name__ == "__main__":
    raise SystemExit(main())
