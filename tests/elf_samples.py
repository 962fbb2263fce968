"""Guest images for the ELF, manifest and inspect tests, built from C with ``tests.guests.guest_elf``.

``harness_elf`` builds a harness with a chosen ``.berm.abi`` manifest and exported tools; ``DISPATCH_SOURCE``
exercises the two relocation kinds the host's CFI relies on: a switch compiled to a jump table (``R_RISCV_64``
words in ``.rodata``) and a function address taken in code (``R_RISCV_PCREL_HI20`` on an ``auipc``).
``LABEL_CALLS_SOURCE`` calls and tail-calls a function that has no symbol through unrelaxed ``auipc``/``jalr``
pairs (``R_RISCV_CALL_PLT``).
"""

from __future__ import annotations

import json
import struct

from tests.guests import guest_elf

#: A switch dense enough for a jump table, each arm doing distinct work (so it is not folded into a data
#: lookup table), plus function pointers taken in code and called through a volatile slot.
DISPATCH_SOURCE = r"""
typedef struct { unsigned long ptr, len; } Pair;
static volatile unsigned long sink;
__attribute__((noinline)) unsigned long arm(unsigned long x) {
    switch (x) {
    case 0: return sink * 3 + 1;
    case 1: sink = x << 7; return 4;
    case 2: return sink ^ 0x55;
    case 3: sink += 11; return sink;
    case 4: return sink / 7;
    case 5: sink = sink * sink; return 2;
    case 6: return sink - 99;
    case 7: sink |= 0x100; return 8;
    }
    return 0;
}
__attribute__((noinline)) unsigned long twice(unsigned long x) { return 2 * x + sink; }
__attribute__((noinline)) unsigned long thrice(unsigned long x) { return 3 * x - sink; }
unsigned long (*volatile slot)(unsigned long);
Pair berm_tool_dispatch(void) {
    slot = (sink & 1) ? twice : thrice;
    Pair p = { 0, slot(arm(sink)) };
    return p;
}
void _start(void) { berm_tool_dispatch(); }
"""


#: The start of an assembly guest: nothing relaxed (each instruction stays as written) and an empty ``_start``.
ASM_PRELUDE = r"""
    .option norelax
    .text
    .globl _start
    .type _start, @function
_start:
    ret
"""

#: ``caller`` calls, and ``tailer`` tail-calls, ``.Lhelper`` (a0 + 22): an assembler-local label, so no symbol
#: makes it a function; it follows ``other`` in another section, so a relocation names it (with relaxation off the
#: assembler resolves a call inside one section itself). ``.option norelax`` (as ``-mno-relax``) keeps each call an
#: ``auipc``/``jalr`` pair: the linker relaxes only calls marked ``R_RISCV_RELAX``.
LABEL_CALLS_SOURCE = ASM_PRELUDE + r"""
    .section .text.caller, "ax", @progbits
    .globl caller, tailer
    .type caller, @function
caller:
    addi sp, sp, -16
    sd ra, 8(sp)
    li a0, 20
    call .Lhelper
    ld ra, 8(sp)
    addi sp, sp, 16
    ret
    .type tailer, @function
tailer:
    li a0, 30
    tail .Lhelper

    .section .text.other, "ax", @progbits
    .globl other
    .type other, @function
other:
    li a0, 1
    ret
.Lhelper:
    addi a0, a0, 22
    ret
"""


def label_calls_elf() -> bytes:
    return guest_elf(LABEL_CALLS_SOURCE, suffix=".S", keep=("caller", "tailer"))


def manifest_json(tools: list[str], **extra) -> str:
    """A well-formed ABI-0 manifest declaring ``tools`` (each with a description and a parameter schema)."""
    doc = {"abi_version": 0,
           "tools": [{"name": t, "description": f"the {t} tool",
                      "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}} for t in tools],
           "usage": "Call the tools."}
    doc.update(extra)
    return json.dumps(doc)


def _c_bytes(raw: bytes) -> str:
    return ", ".join(str(b) for b in raw) or "0"


def harness_source(manifest: bytes | None, tools: list[str]) -> str:
    """C text of a harness exporting ``berm_tool_<t>`` for each tool, with ``manifest`` (raw bytes, no NUL
    added) as its ``.berm.abi`` section, or no such section when ``manifest`` is None."""
    parts = ["typedef struct { unsigned long ptr, len; } Pair;", "static const char text[] = \"ok\";",
             "volatile int started;"]
    if manifest is not None:
        parts.append(f'__attribute__((section(".berm.abi"), used, retain)) static const unsigned char '
                     f"berm_manifest[{max(len(manifest), 1)}] = {{{_c_bytes(manifest)}}};")
    for t in tools:
        parts.append(f"Pair berm_tool_{t}(void) {{ Pair p = {{ (unsigned long)text, 2 }}; return p; }}")
    refs = " ".join(f"(void)berm_tool_{t}();" for t in tools)
    parts.append(f"void _start(void) {{ started = 1; {refs} }}")
    return "\n".join(parts) + "\n"


def harness_elf(manifest: str | bytes | None, tools: list[str]) -> bytes:
    """The ELF bytes of ``harness_source`` (a str manifest is encoded as UTF-8)."""
    raw = manifest.encode() if isinstance(manifest, str) else manifest
    return guest_elf(harness_source(raw, tools), keep=tuple(f"berm_tool_{t}" for t in tools))


def dispatch_elf() -> bytes:
    return guest_elf(DISPATCH_SOURCE, keep=("berm_tool_dispatch",))


# -- locating header fields, for tests that corrupt images ------------------------------------------------------

#: Byte offsets of fields inside the ELF64 header, a program header and a section header, with struct formats.
EHDR_FIELDS = {"e_type": (16, "<H"), "e_machine": (18, "<H"), "e_entry": (24, "<Q"), "e_phoff": (32, "<Q"),
               "e_shoff": (40, "<Q"), "e_flags": (48, "<I"), "e_phentsize": (54, "<H"), "e_phnum": (56, "<H"),
               "e_shentsize": (58, "<H"), "e_shnum": (60, "<H"), "e_shstrndx": (62, "<H")}
PHDR_FIELDS = {"p_type": (0, "<I"), "p_flags": (4, "<I"), "p_offset": (8, "<Q"), "p_vaddr": (16, "<Q"),
               "p_filesz": (32, "<Q"), "p_memsz": (40, "<Q")}
SHDR_FIELDS = {"sh_name": (0, "<I"), "sh_type": (4, "<I"), "sh_flags": (8, "<Q"), "sh_addr": (16, "<Q"),
               "sh_offset": (24, "<Q"), "sh_size": (32, "<Q"), "sh_link": (40, "<I"), "sh_info": (44, "<I"),
               "sh_entsize": (56, "<Q")}


def ehdr(data: bytes, name: str) -> int:
    off, fmt = EHDR_FIELDS[name]
    return struct.unpack_from(fmt, data, off)[0]


def phdr_offsets(data: bytes) -> list[int]:
    """File offsets of the program headers."""
    return [ehdr(data, "e_phoff") + 56 * i for i in range(ehdr(data, "e_phnum"))]


def shdr_offsets(data: bytes) -> dict[str, int]:
    """File offset of each section's header, by section name."""
    base, n = ehdr(data, "e_shoff"), ehdr(data, "e_shnum")
    strtab = base + 64 * ehdr(data, "e_shstrndx")
    names_at = struct.unpack_from("<Q", data, strtab + 24)[0]
    out = {}
    for i in range(n):
        name_off = struct.unpack_from("<I", data, base + 64 * i)[0]
        end = data.index(b"\0", names_at + name_off)
        out[data[names_at + name_off:end].decode()] = base + 64 * i
    return out


def field(data: bytes, header: int, fields: dict, name: str) -> int:
    off, fmt = fields[name]
    return struct.unpack_from(fmt, data, header + off)[0]


def patched(data: bytes, at: int, fmt: str, value: int) -> bytes:
    """``data`` with ``value`` packed as ``fmt`` (masked to its width) at byte offset ``at``."""
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value & ((1 << (8 * struct.calcsize(fmt))) - 1))
    return bytes(out)
