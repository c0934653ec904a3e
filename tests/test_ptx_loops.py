"""scripts/ptx_loops.py on a tiny synthetic PTX kernel: its loops found by their backward branch, instruction /
ex2 / wgmma counts, and the registers live at a loop's head (a WGMMA's accumulators are read, a predicated
definition does not end a live range, a store defines nothing)."""
import pytest

from helpers import load_script

pl = load_script("ptx_loops")

PTX = """
.visible .entry k(
\t.param .u64 k_param_0
)
{
\t.reg .pred \t%p<4>;
\t.reg .b32 \t%r<20>;
\t.reg .b64 \t%rd<6>;

\tld.param.u64 \t%rd1, [k_param_0];
\tmov.u32 \t%r1, 3;
\tmov.u32 \t%r2, 0;
\tmov.u32 \t%r3, 7;
$L__BB0_1:
\t.pragma "nounroll";
\tadd.s32 \t%r2, %r2, %r1;
\tex2.approx.ftz.f32 \t%r4, %r2;
\t// begin inline asm
\t{
\t.reg .pred p;
\tsetp.ne.b32 p, %r4, 0;
\twgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%r6, %r7}, %rd2, %rd3, p, 1, 1, 0, 0;
\t}
\t// end inline asm
\tsetp.lt.s32 \t%p1, %r2, 100;
\t@%p1 mov.u32 \t%r8, 1;
\t@%p1 bra \t$L__BB0_1;
\tadd.s32 \t%r5, %r2, %r3;
\tadd.s32 \t%r5, %r5, %r8;
\tst.global.u32 \t[%rd1], %r5;
\tret;
}
"""


def test_loop_counts():
    (loop,) = pl.analyse(PTX)
    assert loop.head == "$L__BB0_1" and loop.ex2 == 1 and loop.wgmma == 1
    # add, ex2, setp p, wgmma, setp %p1, @mov, @bra (the .pragma, braces and .reg inside the asm left out)
    assert loop.instructions == 7 and loop.live_in is None


def test_live_at_the_head():
    (loop,) = pl.analyse(PTX, live=True)
    # %r1, %r2, %r3 (used after the loop), %r6 and %r7 (read by the WGMMA before it writes them), %r8 (its only
    # definition is predicated), %rd1 (2 units: the store's address), %rd2 and %rd3 (2 each): 6 + 2 + 4
    assert loop.live_in == 12


@pytest.mark.parametrize("line, defs, uses", [
    ("add.s32 \t%r5, %r2, %r3;", {"%r5"}, {"%r2", "%r3"}),
    ("st.global.u32 \t[%rd1], %r5;", set(), {"%rd1", "%r5"}),
    ("stmatrix.sync.aligned.m8n8.x4.shared.b16 \t[%r9], {%r1, %r2, %r3, %r4};", set(), {"%r9", "%r1", "%r2", "%r3",
                                                                                       "%r4"}),
    ("mov.b64 \t{%r1, %r2}, %rd4;", {"%r1", "%r2"}, {"%rd4"}),
    ("@%p1 mov.u32 \t%r8, 1;", {"%r8"}, {"%p1"}),
    ("elect.sync \t%r794|%p104, -1;", {"%r794", "%p104"}, set()),           # both halves are written
    ("mbarrier.arrive.expect_tx.shared.b64 \t%rd71, [%r5], 16384;", {"%rd71"}, {"%r5"}),  # the state is written
    ("mbarrier.arrive.shared.b64 \t_, [%r5];", set(), {"%r5"}),            # the sink: nothing written
    ("mbarrier.try_wait.parity.shared.b64 P1, [%r678], %r1683, 10000000;", set(), {"%r678", "%r1683"}),
    ("bar.sync \t%r43, 256;", set(), {"%r43"}),
])
def test_defs_and_uses(line, defs, uses):
    d, u, predicated = pl.defs_uses(line)
    assert (d, u, predicated) == (defs, uses, line.startswith("@"))


def test_cli_table(tmp_path, capsys):
    path = tmp_path / "k.ptx"
    path.write_text(PTX, encoding="utf-8")
    assert pl.main([str(path), "--live"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("live at head |") and out[2] == "| $L__BB0_1 | 14-27 | 7 | 1 | 1 | 12 |"


def _loop_with(tail: str) -> str:
    """A one-block loop (head $L__BB0_1) using %r1, %r2, whose exit runs ``tail``; $L__BB0_3 stores %r9."""
    return f"""
.visible .entry k()
{{
\tmov.u32 \t%r2, 0;
\t@%p3 bra \t$L__BB0_3;
$L__BB0_1:
\tadd.s32 \t%r2, %r2, %r1;
\tsetp.lt.s32 \t%p1, %r2, 100;
\t@%p1 bra \t$L__BB0_1;
{tail}
$L__BB0_3:
\tst.global.u32 \t[%rd1], %r9;
\tret;
}}
"""


def test_ret_ends_a_block():
    """A block that ends in ``ret;`` does not fall through into the next label: %r9, used only past it, is not live
    at the loop's head (%r1, %r2 are; %rd1 only on the path past ret)."""
    (loop,) = pl.analyse(_loop_with("\tret;"), live=True)
    assert loop.live_in == 2
    (loop,) = pl.analyse(_loop_with(""), live=True)  # falling through: %r9 and %rd1 live too
    assert loop.live_in == 5


def test_a_side_exit_ends_a_block():
    """A conditional branch ends its block even without a label after it: %r1, redefined after the side exit that
    leads to its use, is still live at the head."""
    ptx = """
.visible .entry k()
{
$L__BB0_1:
\tadd.s32 \t%r3, %r3, 1;
\t@%p1 bra \t$L__BB0_2;
\tmov.u32 \t%r1, %r2;
\tbra.uni \t$L__BB0_1;
$L__BB0_2:
\tst.global.u32 \t[%rd1], %r1;
\tret;
}
"""
    (loop,) = pl.analyse(ptx, live=True)
    assert loop.live_in == 1 + 1 + 1 + 2  # %r1, %r2, %r3, %rd1


def test_empty_blocks_and_asm_labels():
    """An empty entry block and a label right after a label do not break --live; labels inside inline assembly are
    not counted as instructions; a second kernel in the file is not read."""
    ptx = """
.visible .entry k()
{
$L__BB0_1:
$L__BB0_2:
\t{
\tLAB_WAIT:
\tmbarrier.try_wait.parity.shared.b64 P1, [%r5], %r6, 1000;
\t@P1 bra.uni DONE;
\tbra.uni LAB_WAIT;
\tDONE:
\t}
\t@%p1 bra \t$L__BB0_1;
\tret;
}
.visible .entry other()
{
$L__BB1_1:
\t@%p2 bra \t$L__BB1_1;
}
"""
    (loop,) = pl.analyse(ptx, live=True)
    assert loop.head == "$L__BB0_1" and loop.instructions == 4 and loop.live_in == 2  # %r5, %r6
