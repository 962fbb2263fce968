"""Atomics on translated code where random programs rarely put them: an ``sc`` or AMO into read-only data (a store:
it faults, where an ``lr`` reads), and the memory an ``sc`` alone wrote, which must be gone in the next run like any
store's (a mutation review: a translator checking every atomic as a load, or an ``sc`` that did not mark its page
dirty, got past every other test)."""

from __future__ import annotations

from tests import progen
from tests.rvenc import Op, li
from tests.test_aot_diff import assert_same, run_both

A0, A4, A5, A6, A7 = 10, 14, 15, 16, 17
RET = Op("jalr", rs1=1)


def _gen(name: str, ops: list, **image) -> progen.GenProgram:
    img = progen.build_image([progen.Function("f0", [*ops, RET])], **image)
    return progen.GenProgram(img, img.entry, name)


def test_an_atomic_that_stores_into_read_only_data_faults_as_a_store():
    at = progen.RODATA + 8
    cases = {
        "lr.d": ([Op("lr.d", rd=A6, rs1=A5)], None),
        "sc.w": ([Op("lr.w", rd=A6, rs1=A5), Op("sc.w", rd=A4, rs1=A5, rs2=A7)], "store 4 bytes"),
        "sc.d": ([Op("lr.d", rd=A6, rs1=A5), Op("sc.d", rd=A4, rs1=A5, rs2=A7)], "store 8 bytes"),
        "amoswap.d": ([Op("amoswap.d", rd=A6, rs1=A5, rs2=A7)], "store 8 bytes"),
        "amoadd.w": ([Op("amoadd.w", rd=A6, rs1=A5, rs2=A7)], "store 4 bytes"),
    }
    gens = [_gen(name, [*li(A5, at), *li(A7, 0x55), *ops], rodata=bytes(8) + (0x1234).to_bytes(8, "little"))
            for name, (ops, _) in cases.items()]
    for (gen, expected, (got,)), (name, (_, detail)) in zip(run_both(gens), cases.items()):
        assert (expected.trap and (expected.trap.addr, expected.trap.detail)) == (detail and (at, detail)), name
        if detail is None:
            assert expected.regs[A6] == 0x1234
        assert_same(gen, expected, got)


def test_what_an_sc_stored_is_gone_in_the_next_run():
    """The only store to its page is the ``sc``'s: each run first reads the word it then writes (a0), which must
    be .data's first value every time."""
    gens = [_gen(width, [*li(A5, progen.DATA + 2048), Op("ld", rd=A0, rs1=A5), Op(f"lr.{width}", rd=A6, rs1=A5),
                         *li(A7, 0x55), Op(f"sc.{width}", rd=A4, rs1=A5, rs2=A7)],
                 data=bytes(2048) + (0x1122334455667788).to_bytes(8, "little") + bytes(2040))
            for width in ("w", "d")]
    for gen, expected, results in run_both(gens, repeat=2):
        assert expected.trap is None and expected.regs[A0] == 0x1122334455667788 and expected.regs[A4] == 0
        for got in results:
            assert_same(gen, expected, got)
