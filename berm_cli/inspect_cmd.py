"""``berm inspect ELF [--json] [--disassemble]``: what a harness claims and what its image holds, without running
any of it (ABI.md §4: learning what a harness claims must never mean running it)."""

from __future__ import annotations

import argparse
import bisect
import json
from collections import Counter
from pathlib import Path

from berm_abi.errors import BermError
from berm_abi.text import escaped
from berm_aot.demangle import shown_name, shown_text
from berm_aot.disasm import disassemble
from berm_aot.elf import read_elf_file
from berm_aot.errors import about_file
from berm_aot.image import ElfImage
from berm_aot.isa import BRANCHES
from berm_aot.manifest import Manifest, load_manifest, tool_exports
from berm_aot.program import Program
from berm_cli import arguments
from berm_cli.terminal import shown
from berm_host.declaration import DeclarationError, load_declarations
from berm_host.grants import DAEMON_GRANTS, LINKED, grant_report

_EF_RISCV_RVC = 0x1
#: Columns the section names are padded to, at most (a longer name pushes its own line only).
SECTION_WIDTH = 24


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("elf", type=arguments.path, help="the harness image (an RV64 ELF)")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true",
                      help="print the manifest JSON with an \"image\" object of the facts below and \"grants\" "
                           "(null without --declaration) in place of any keys of those names")
    form.add_argument("--disassemble", action="store_true",
                      help="also print every function's reachable instructions")
    parser.add_argument("--declaration", metavar="TOML", type=arguments.path,
                        help="an agent's [[harnesses]] file: also show what its entry for this harness would grant")
    parser.add_argument("--harness", metavar="NAME",
                        help="the entry to use from --declaration (default: the image's file name stem)")


def run(args: argparse.Namespace) -> int:
    if args.harness is not None and args.declaration is None:  # taken without a word (found by a review)
        raise BermError("--harness names an entry of --declaration: without one it gives nothing")
    image = read_elf_file(args.elf)
    with about_file(args.elf):
        manifest = load_manifest(image)
    facts = image_facts(image)
    grants = declared_grants(args, image, manifest)
    if args.json:
        print(_json_document({**manifest.raw, "image": facts, "grants": grants}))
    else:
        print(shown(render_text(str(args.elf), manifest, facts)))
        if grants is not None:
            print(f"\ngrants (from {escaped(str(args.declaration), lines=False)}):")
            print("\n".join(f"  {escaped(name, lines=False)}: {status}" for name, status in grants.items()) or "  none")
    if args.disassemble:
        print(shown(render_disassembly(image)))
    return 0


def _json_document(doc: dict) -> str:
    """``doc`` as JSON, a line per top-level key, each value compact: indented throughout, a 1 MB manifest nested 99
    deep printed 105 MB of indentation (found by a review)."""
    lines = [f"  {json.dumps(key)}: {json.dumps(value, sort_keys=True)}" for key, value in sorted(doc.items())]
    return "{\n" + ",\n".join(lines) + "\n}"


def declared_grants(args: argparse.Namespace, image: ElfImage, manifest: Manifest) -> dict[str, str] | None:
    """With ``--declaration``: each requested or granted capability and what the declaration makes of it."""
    if not args.declaration:
        return None
    name = args.harness or Path(args.elf).stem
    entry = next((d for d in load_declarations(args.declaration) if d.name == name), None)
    if entry is None:
        raise DeclarationError(f"{args.declaration} declares no harness named {name!r}")
    if entry.sha256 is not None and entry.sha256 != image.sha256:
        raise DeclarationError(f"{args.declaration}: the entry for {name!r} pins sha256 {entry.sha256}, and this "
                               f"image's is {image.sha256}: the host would refuse it, granting nothing")
    report = grant_report(entry, manifest.requests.get("capabilities", []), extra=DAEMON_GRANTS)
    # linked by the daemon only (berm call runs a harness alone): reported as absent, what berm serve grants was
    # understated, berm.call reaching every declared harness's tools among it (found by a review)
    return {name: status.replace(LINKED, f"{LINKED} by berm serve", 1) if name in DAEMON_GRANTS else status
            for name, status in report.items()}


def _perms(readable: bool, writable: bool, executable: bool) -> str:
    return ("r" if readable else "-") + ("w" if writable else "-") + ("x" if executable else "-")


def image_facts(image: ElfImage) -> dict:
    """The JSON-ready facts of an image: digest, layout, sections, relocation counts and tool exports."""
    return {
        "sha256": image.sha256,
        "file_size": image.size,
        "entry": image.entry,
        "flags": image.flags,
        "rvc": bool(image.flags & _EF_RISCV_RVC),
        "segments": [{"vaddr": s.vaddr, "memsz": s.memsz, "filesz": len(s.data),
                      "perms": _perms(s.readable, s.writable, s.executable)} for s in image.segments],
        "sections": [{"name": s.name, "addr": s.addr, "size": s.size, "alloc": s.alloc,
                      "perms": _perms(s.alloc, s.writable, s.executable)} for s in image.sections],
        "relocations": dict(sorted(Counter(r.type_name for r in image.relocations).items())),
        "exports": dict(sorted(tool_exports(image).items())),
    }


def render_text(path: str, manifest: Manifest, facts: dict) -> str:
    out = [f"{path}: {facts['file_size']} bytes, sha256 {facts['sha256']}",
           f"entry {facts['entry']:#x}, e_flags {facts['flags']:#x} ({'RVC, ' if facts['rvc'] else ''}soft-float)",
           f"ABI version {manifest.abi_version}", "", "tools:"]
    exports = facts["exports"]
    for tool in manifest.tools:
        out.append(f"  {tool.name} @ {exports[tool.name]:#x}: {_line(tool.description)}")
        out.append(f"    parameters: {json.dumps(tool.parameters, sort_keys=True)}")
    undeclared = sorted(set(exports) - {t.name for t in manifest.tools})
    for name in undeclared:
        out.append(f"  {name} @ {exports[name]:#x}: exported, not declared in the manifest")
    out += ["", "usage:"] + [f"  {line}" for line in (manifest.usage or "(none)").split("\n")]  # only "\n": splitlines
    # also broke at \r, U+2028 and others, which were then not shown escaped (found by a review)
    out += ["", "requests (documentation, not grants):"]
    out += [f"  {_line(key)}: {_line(', '.join(values)) or '(empty)'}"
            for key, values in manifest.requests.items()] or ["  none"]
    out += ["", "segments:"]
    out += [f"  {s['vaddr']:#010x}  memsz {s['memsz']:#x}  filesz {s['filesz']:#x}  {s['perms']}"
            for s in facts["segments"]]
    out += ["", "sections:"]
    # cut, and padded no wider than SECTION_WIDTH: every line padded to the longest escaped name made 2,000 sections
    # and one name of 10,000 control bytes an 80 MB listing of a 141 KB file (found by a review)
    names = [shown_text(s["name"]) for s in facts["sections"]]
    width = min(max(map(len, names), default=0), SECTION_WIDTH)
    out += [f"  {name:<{width}}  {s['addr']:#010x}  {s['size']:>8}  {s['perms'] if s['alloc'] else ''}"
            for name, s in zip(names, facts["sections"])]
    out += ["", "relocations:"]
    out += [f"  {name:<22} {count}" for name, count in facts["relocations"].items()]
    return "\n".join(out)


def _line(text: str) -> str:
    """Text of the image's shown on one line: a newline in a description could print a "grants:" section of its own."""
    return escaped(text, lines=False)


def _target(program: Program, insn) -> str:
    """`` <name+0xoff>`` for the target of a direct jump, call or branch (as objdump prints it), else ""."""
    if insn.op != "jal" and insn.op not in BRANCHES:
        return ""
    return f" <{program.symbolize((insn.addr + insn.imm) & (2**64 - 1))}>"


def render_disassembly(image: ElfImage) -> str:
    """Every function's reachable instructions; bytes the recursive descent never reached are summarised."""
    program = Program.from_image(image)
    code = sorted(program.code)
    first = bisect.bisect_left
    out = []
    for fn in program.functions:
        out += ["", f"{shown_name(fn.name)} <{fn.start:#x}>:"]
        pc = fn.start
        for addr in code[first(code, fn.start):first(code, fn.end)]:
            if addr > pc:
                out.append(f"  {pc:8x}:  ({addr - pc} bytes not reached as code)")
            insn = program.code[addr]
            raw = f"{insn.raw:04x}" if insn.size == 2 else f"{insn.raw:08x}"
            out.append(f"  {addr:8x}:  {raw:<8}  {disassemble(insn)}{_target(program, insn)}")
            pc = insn.next_pc
        if pc < fn.end:
            out.append(f"  {pc:8x}:  ({fn.end - pc} bytes not reached as code)")
    return "\n".join(out)

