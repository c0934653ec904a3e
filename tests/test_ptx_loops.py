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
    ("mov.b64 \t{%r1, %r2}, %rd4;", {"%r1", "%r2"}, {"%rd4"}),
    ("@%p1 mov.u32 \t%r8, 1;", {"%r8"}, {"%p1"}),
])
def test_defs_and_uses(line, defs, uses):
    d, u, predicated = pl.defs_uses(line)
    assert (d, u, predicated) == (defs, uses, line.startswith("@"))


def test_cli_table(tmp_path, capsys):
    path = tmp_path / "k.ptx"
    path.write_text(PTX)
    assert pl.main([str(path), "--live"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("live at head |") and out[2] == "| $L__BB0_1 | 14-27 | 7 | 1 | 1 | 12 |"
