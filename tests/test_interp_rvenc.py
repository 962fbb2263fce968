"""The test assembler (tests/rvenc.py) against LLVM's: every encoding it produces, at its immediate extremes,
must be byte-identical to what the LLVM assembler makes of the same text. The interpreter's instruction tests and
the random programs of tests/progen.py are only as good as this encoder."""

from __future__ import annotations

import subprocess
import sys

import pytest
from elftools.elf.elffile import ELFFile

from tests import rvenc
from tests.rvenc import Op

MEM = {*rvenc.LOAD_OPS, "jalr"}


def _asm_text(op: Op) -> str:
    n, rd, rs1, rs2, imm = op.name, f"x{op.rd}", f"x{op.rs1}", f"x{op.rs2}", op.imm
    if n in ("ecall", "ebreak", "fence.i", "c.ebreak", "c.nop") and not imm:
        return n
    if n == "fence":
        return "fence iorw, iorw"
    if n in ("lui", "auipc"):
        return f"{n} {rd}, {(imm >> 12) & 0xFFFFF}"
    if n == "c.lui":
        return f"{n} {rd}, {(imm >> 12) & 0xFFFFF}"
    if n == "jal":
        return f"jal {rd}, {imm}"
    if n in MEM or n in ("c.lw", "c.ld", "c.lwsp", "c.ldsp"):
        return f"{n} {rd}, {imm}({rs1})"
    if n in rvenc.STORE_OPS or n in ("c.sw", "c.sd", "c.swsp", "c.sdsp"):
        return f"{n} {rs2}, {imm}({rs1})"
    if n in rvenc.BRANCH_OPS:
        return f"{n} {rs1}, {rs2}, {imm}"
    if n in rvenc.AMO_OPS:
        suffix = (".aq" if op.aq else "") + (".rl" if op.rl else "")
        suffix = ".aqrl" if op.aq and op.rl else suffix
        if n.startswith("lr"):
            return f"{n}{suffix} {rd}, ({rs1})"
        return f"{n}{suffix} {rd}, {rs2}, ({rs1})"
    if n in rvenc.ALU_RR_OPS:
        return f"{n} {rd}, {rs1}, {rs2}"
    if n in rvenc.ALU_RI_OPS or n in rvenc.SHIFT_IMM_OPS:
        return f"{n} {rd}, {rs1}, {imm}"
    if n in ("c.j",):
        return f"{n} {imm}"
    if n in ("c.beqz", "c.bnez"):
        return f"{n} {rs1}, {imm}"
    if n in ("c.jr", "c.jalr"):
        return f"{n} {rs1}"
    if n in ("c.mv", "c.add", "c.sub", "c.xor", "c.or", "c.and", "c.subw", "c.addw"):
        return f"{n} {rd}, {rs2}"
    if n == "c.addi4spn":
        return f"{n} {rd}, x2, {imm}"
    if n == "c.addi16sp":
        return f"{n} x2, {imm}"
    return f"{n} {rd}, {imm}"  # c.addi, c.addiw, c.li, c.slli, c.srli, c.srai, c.andi, c.nop


def _cases32() -> list[Op]:
    ops = [Op(n) for n in ("ecall", "ebreak", "fence", "fence.i")]
    for imm in (0, 4096, -4096, 0x7FFFF000, -(1 << 31)):
        ops += [Op("lui", rd=5, imm=imm), Op("auipc", rd=31, imm=imm)]
    for imm in (0, 2, -2, 2046, (1 << 20) - 2, -(1 << 20)):
        ops += [Op("jal", rd=1, imm=imm), Op("jal", rd=0, imm=imm)]
    for imm in (0, -2048, 2047, 1):
        ops += [Op("jalr", rd=1, rs1=2, imm=imm)]
        ops += [Op(n, rd=7, rs1=31, imm=imm) for n in rvenc.LOAD_OPS]
        ops += [Op(n, rs1=30, rs2=9, imm=imm) for n in rvenc.STORE_OPS]
        ops += [Op(n, rd=11, rs1=12, imm=imm) for n in rvenc.ALU_RI_OPS]
    for imm in (0, 2, -2, 4094, -4096, 2048):
        ops += [Op(n, rs1=3, rs2=29, imm=imm) for n in rvenc.BRANCH_OPS]
    ops += [Op(n, rd=13, rs1=14, rs2=15) for n in rvenc.ALU_RR_OPS]
    ops += [Op(n, rd=16, rs1=17, imm=s) for n in rvenc.SHIFT_IMM_OPS for s in (0, 1, 31)]
    ops += [Op(n, rd=16, rs1=17, imm=s) for n in ("slli", "srli", "srai") for s in (32, 63)]
    for aq, rl in ((False, False), (True, False), (False, True), (True, True)):
        ops += [Op(n, rd=18, rs1=19, rs2=0 if n.startswith("lr") else 20, aq=aq, rl=rl) for n in rvenc.AMO_OPS]
    return ops


def _cases16() -> list[Op]:
    ops = [Op("c.nop"), Op("c.ebreak"), Op("c.jr", rs1=1), Op("c.jalr", rs1=15), Op("c.mv", rd=10, rs2=31),
           Op("c.add", rd=2, rs2=1)]
    ops += [Op("c.addi4spn", rd=15, imm=i) for i in (4, 8, 1020, 512)]
    for n, hi in (("c.lw", 124), ("c.sw", 124), ("c.ld", 248), ("c.sd", 248)):
        step = 8 if n in ("c.ld", "c.sd") else 4
        ops += [Op(n, rd=8, rs1=15, rs2=9, imm=i) for i in (0, step, hi, 64)]
    ops += [Op(n, rd=r, rs1=r, imm=i) for n in ("c.addi", "c.li", "c.addiw") for r in (1, 31) for i in (1, -1, 31, -32)]
    ops += [Op("c.addi16sp", imm=i) for i in (16, -16, 496, -512)]
    ops += [Op("c.lui", rd=r, imm=i) for r in (1, 3, 31) for i in (4096, -4096, (1 << 17) - 4096, -(1 << 17))]
    ops += [Op(n, rd=r, imm=i) for n in ("c.srli", "c.srai") for r in (8, 15) for i in (1, 31, 32, 63)]
    ops += [Op("c.andi", rd=r, imm=i) for r in (8, 15) for i in (0, -1, 31, -32)]
    ops += [Op(n, rd=9, rs2=14) for n in ("c.sub", "c.xor", "c.or", "c.and", "c.subw", "c.addw")]
    ops += [Op("c.j", imm=i) for i in (0, 2, -2, 2046, -2048, 1024)]
    ops += [Op(n, rs1=10, imm=i) for n in ("c.beqz", "c.bnez") for i in (0, 2, -2, 254, -256, 32)]
    ops += [Op("c.slli", rd=r, imm=i) for r in (1, 31) for i in (1, 32, 63)]
    ops += [Op("c.lwsp", rd=r, rs1=2, imm=i) for r in (1, 31) for i in (0, 4, 252, 128)]
    ops += [Op("c.ldsp", rd=r, rs1=2, imm=i) for r in (1, 31) for i in (0, 8, 504, 256)]
    ops += [Op("c.swsp", rs2=r, rs1=2, imm=i) for r in (0, 31) for i in (0, 4, 252, 128)]
    ops += [Op("c.sdsp", rs2=r, rs1=2, imm=i) for r in (0, 31) for i in (0, 8, 504, 256)]
    return ops


def _llvm_bytes(ops32: list[Op], ops16: list[Op], tmp_path) -> bytes:
    lines = [".option norvc", *map(_asm_text, ops32), ".option rvc", *map(_asm_text, ops16)]
    src, obj = tmp_path / "enc.S", tmp_path / "enc.o"
    src.write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-m", "ziglang", "cc", "-target", "riscv64-freestanding-none",
           "-mcpu=baseline_rv64-d-f", "-mno-relax", "-c", str(src), "-o", str(obj)]
    subprocess.run(cmd, check=True, capture_output=True)
    with open(obj, "rb") as f:
        return ELFFile(f).get_section_by_name(".text").data()


def test_every_encoding_matches_llvm(tmp_path):
    ops32, ops16 = _cases32(), _cases16()
    theirs = _llvm_bytes(ops32, ops16, tmp_path)
    pos = 0
    for op in ops32 + ops16:
        mine = rvenc.encode(op)
        assert theirs[pos:pos + op.size] == mine, f"{_asm_text(op)}: llvm {theirs[pos:pos + op.size].hex()}, " \
                                                 f"rvenc {mine.hex()}"
        pos += op.size
    assert pos == len(theirs)


def test_every_compressed_op_is_covered():
    assert {op.name for op in _cases16()} == set(rvenc.COMPRESSED_OPS)


@pytest.mark.parametrize("value", [0, 1, -1, 2047, -2048, 2048, 0x7FFFFFFF, -(1 << 31), 1 << 31, 0x123456789ABCDEF0,
                                   (1 << 63), (1 << 64) - 1, 0x8000_0000_0000_0001, 0xFFF, 0x1000_0000_0800])
def test_li_sequences_compute_the_value(value):
    """Evaluate the li expansion with a tiny model of the four instructions it uses."""
    mask = (1 << 64) - 1
    r = 0
    for op in rvenc.li(5, value):
        if op.name == "addi":
            r = ((r if op.rs1 else 0) + op.imm) & mask
        elif op.name == "lui":
            r = (op.imm - (1 << 32) if op.imm & (1 << 31) else op.imm) & mask
        elif op.name == "addiw":
            r = ((r + op.imm) & 0xFFFFFFFF)
            r = (r - (1 << 32) if r >> 31 else r) & mask
        elif op.name == "slli":
            r = (r << op.imm) & mask
    assert r == value & mask
