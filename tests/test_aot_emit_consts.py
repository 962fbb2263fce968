"""The constant registers the translator folds (berm_aot/emit/consts.py) decide which host call an ``ecall`` makes
at translation time: a core call answered by a field of ctx is served inline, with no look at a7 at run time. So a
wrong fold is only seen when it lands on such a call's number while the guest's a7 holds another: each case here
computes a7 so that the guest's value is not ``berm.heap.start`` and a translator folding the instruction wrongly
(a mutation review: ``andi`` as ``|``, ``addiw`` without its sign extension, ``slli`` by 32 as by 0, ``add`` as
``-``, ``lw`` zero-extending, ``lwu`` sign-extending, a load from writable data taken as constant, an ``ecall``
leaving a0 known, a loop's head keeping what the entry path knew) would get exactly that number, and serve it."""

from __future__ import annotations

import re

from berm_abi.names import core_number
from berm_host.layout import layout_for
from berm_host.traps import TrapKind
from tests import progen
from tests.rvenc import Label, Op, li
from tests.test_aot_diff import assert_same, run_both

START, SIZE = core_number("berm.heap.start"), core_number("berm.heap.size")
MASK = (1 << 64) - 1
A0, A5, A6, A7 = 10, 15, 16, 17
WORD = 0x8000_0000  # the rodata word lw / lwu read: bit 31 set, so the two extensions differ
RET = Op("jalr", rs1=1)


def cases() -> dict[str, tuple[list, object]]:
    """name → (f0's body before its ecall and ret, what the guest gets: a0 or a trap kind)."""
    unknown = TrapKind.UNKNOWN_HOST_CALL
    heap = layout_for(progen.build_image([progen.Function("f0", [RET])]), progen.MEMORY_SIZE)
    return {
        # a0 holds START before an ecall that returns the heap's size: a7 = a0 afterwards is that size, no call
        "ecall writes a0": ([*li(A7, SIZE), *li(A0, START), Op("ecall"), Op("addi", rd=A7, rs1=A0)], unknown),
        "andi": ([*li(A7, START), Op("andi", rd=A7, rs1=A7, imm=0)], unknown),
        "xori": ([*li(A7, START), Op("xori", rd=A7, rs1=A7, imm=1)], unknown),
        "addiw": ([*li(A7, START), Op("addiw", rd=A7, rs1=A7, imm=0)], unknown),
        "slli by 32": ([*li(A7, START), Op("slli", rd=A7, rs1=A7, imm=32)], unknown),
        "add": ([*li(A5, START + 7), *li(A6, 7), Op("add", rd=A7, rs1=A5, rs2=A6)], unknown),
        # START - WORD + the word: START when the load zero-extends, START - 2^32 when it sign-extends (as it must)
        "lw": ([*li(A5, progen.RODATA), Op("lw", rd=A7, rs1=A5), *li(A6, START - WORD),
                Op("add", rd=A7, rs1=A7, rs2=A6)], unknown),
        "lwu": ([*li(A5, progen.RODATA), Op("lwu", rd=A7, rs1=A5), *li(A6, START - WORD + (1 << 32)),
                 Op("add", rd=A7, rs1=A7, rs2=A6)], unknown),
        # .data starts as START, but the guest stores 0 there first: data is not constant
        "writable data": ([*li(A5, progen.DATA), Op("sd", rs1=A5, rs2=0), Op("ld", rd=A7, rs1=A5)], unknown),
        "read-only data": ([*li(A5, progen.RODATA + 8), Op("ld", rd=A7, rs1=A5)], heap.heap_start),
        # twice round a loop: START on the first pass, SIZE on the second; after it, a7 = START when a5 (what the second
        # pass's ecall returned) is the heap's size
        "loop": ([*li(A7, START), *li(A6, 2), Label(".loop"), Op("ecall"), Op("addi", rd=A5, rs1=A0),
                  *li(A7, SIZE), Op("addi", rd=A6, rs1=A6, imm=-1), Op("bne", rs1=A6, rs2=0, target=".loop"),
                  *li(A6, START - heap.heap_size), Op("add", rd=A7, rs1=A5, rs2=A6)], heap.heap_start),
    }


def test_an_ecall_whose_number_is_folded_makes_the_call_the_guest_computed():
    gens = []
    for name, (ops, _) in cases().items():
        image = progen.build_image([progen.Function("f0", [*ops, Op("ecall"), RET])],
                                   rodata=WORD.to_bytes(4, "little") + bytes(4) + START.to_bytes(8, "little"),
                                   data=START.to_bytes(8, "little"))
        gens.append(progen.GenProgram(image, image.entry, name))
    for (gen, expected, (got,)), (name, (_, want)) in zip(run_both(gens), cases().items()):
        assert (expected.trap.kind if expected.trap else expected.regs[A0]) == want, name
        assert_same(gen, expected, got)


def test_a_two_argument_call_of_a_known_number_takes_the_entry_of_two_arguments():
    """A core call of two arguments whose number the fold knows goes through ctx->ecall2 (five arguments in
    registers: the host-call benchmark's row); one whose number is known only at run time through ctx->ecall with
    every argument. The core serves both alike, so only the emitted C tells them apart (found by a review)."""
    from berm_aot.emit import emit_units
    from berm_aot.program import Program

    read = core_number("berm.args.read")
    ops = [*li(A7, read), *li(A0, progen.DATA), *li(11, 8), Op("ecall"),
           *li(A5, progen.DATA), Op("ld", rd=A7, rs1=A5), Op("ecall"), RET]
    image = progen.build_image([progen.Function("f0", ops)], data=read.to_bytes(8, "little"))
    program = Program.from_image(image)
    c = "".join(emit_units(program, windows=layout_for(image, progen.MEMORY_SIZE).windows()))
    two = re.findall(r"ctx->ecall2\(ctx, 0x[0-9a-f]+ull, (\w+), x10, x11\)", c)
    every = re.findall(r"ctx->ecall\(ctx, 0x[0-9a-f]+ull, x17, x10, x11, x12, x13, x14, x15\)", c)
    assert two == [f"{read:#x}ull"] and len(every) == 1 and c.count("ctx->ecall") == 2, c
