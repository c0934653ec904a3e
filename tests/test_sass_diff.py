"""scripts/sass_diff.py on a tiny synthetic SASS listing (nvdisasm -c layout): loops found by their backward
branch, retry blocks after the exit left out, opcode classes, the per-loop table, a cold path skipped."""
from helpers import load_script

sd = load_script("sass_diff")

# A: a 6-instruction loop with a 2-instruction rare block skipped by a forward branch, a 2-instruction spin, and a
# retry block after EXIT that branches back above it (not a loop: its span holds the EXIT).
A = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0020*/              @!P0 BRA `(.L_x_9) ;
.L_x_1:
        /*0030*/                   FFMA.FTZ R3, R4, R5, -R6 ;
        /*0040*/                   MUFU.EX2 R3, R3 ;
        /*0050*/              @!P1 BRA `(.L_x_2) ;
        /*0060*/                   FADD R4, R4, -R7 ;
        /*0070*/                   FADD R5, R5, -R7 ;
.L_x_2:
        /*0080*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*0090*/               @P2 BRA `(.L_x_1) ;
        /*00a0*/                   EXIT ;
.L_x_9:
        /*00b0*/                   SYNCS.PHASECHK.TRANS64 P0, [UR4], R2 ;
        /*00c0*/                   BRA `(.L_x_0) ;
"""

# B: one loop of 4 instructions.
B = """
.L_x_5:
        /*0000*/                   FFMA R3, R4, R5, -R6 ;
        /*0010*/                   MUFU.EX2 R3, R3 ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*0030*/               @P2 BRA `(.L_x_5) ;
        /*0040*/                   EXIT ;
"""


def test_loops_and_classes():
    instrs, labels = sd.parse(A)
    assert len(instrs) == 13 and labels["L_x_1"] == 0x30 and labels["L_x_2"] == 0x80
    found = sd.loops(instrs, labels, min_size=1)
    assert [len(body) for body in found] == [7]  # 0x30..0x90; the retry block spans the EXIT: not a loop
    counts = sd.classes(found[0])
    assert counts == {"FFMA": 1, "MUFU.EX2": 1, "BRA": 2, "FADD": 2, "HGMMA": 1}
    assert sd.op_class("@!UP1 SYNCS.ARRIVE.TRANS64.ART0 RZ, [UR4], R2") == "SYNCS.ARRIVE"
    assert sd.op_class("FFMA.FTZ R3, R4, R5, R6", modifiers=1) == "FFMA.FTZ"
    assert sd.loops(instrs, labels, min_size=8) == []


def test_skip_cold_leaves_out_the_jumped_over_block():
    instrs, labels = sd.parse(A)
    body = sd.drop_cold(sd.loops(instrs, labels)[0], labels, ["L_x_2"])
    assert [a for a, _ in body] == [0x30, 0x40, 0x50, 0x80, 0x90]
    loop = sd.loops(instrs, labels)[0]
    assert sd.long_jumps(loop, labels, 2) == ["L_x_2"] and sd.long_jumps(loop, labels, 3) == []


def test_cli_table(tmp_path, capsys):
    (tmp_path / "a.sass").write_text(A, encoding="utf-8")
    (tmp_path / "b.sass").write_text(B, encoding="utf-8")
    rc = sd.main([str(tmp_path / "a.sass"), str(tmp_path / "b.sass"), "--min-size", "3", "--labels", "ours", "fa4",
                  "--skip-cold-a", "L_x_2"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line and line.split()[0].isupper()}
    assert rows["FFMA"] == ["1", "1", "+0"] and rows["BRA"] == ["2", "1", "-1"]
    assert rows["TOTAL"] == ["5", "4", "-1"]
    assert sd.main([str(tmp_path / "a.sass"), str(tmp_path / "b.sass"), "--min-size", "3", "--pair", "0:1"]) == 2


def test_sass_dump_changes():
    """scripts/sass_dump.py's --set pairs: bools and ints as Sm90Config changes; a bad pair is a ValueError."""
    import pytest

    dump = load_script("sass_dump")
    assert dump.parse_changes(["alpha_first=True", "tile_n=176", "pingpong=False"]) == dict(
        alpha_first=True, tile_n=176, pingpong=False)
    for bad in ["alpha_first", "=1", "alpha_first=yes"]:
        with pytest.raises(ValueError, match="--set"):
            dump.parse_changes([bad])


def _hex_listing(instrs):
    """A listing in nvdisasm -c -hex's layout: each instruction with its first 64-bit word on its line and the
    second (stall count in bits 41-44, here with no scoreboard: write/read barrier 7) alone on the next line."""
    lines = [".L_x_5:"]
    for addr, (text, stall_count) in enumerate(instrs):
        second = (stall_count << 41) | (7 << 46) | (7 << 49) | 0x000FE2
        lines.append(f"        /*{addr * 16:04x}*/                   {text} ;   /* 0x000000000000{addr:04x} */")
        lines.append(f"                                                             /* 0x{second:016x} */")
    return "\n".join(lines) + "\n"


def test_stall_cycles_from_encodings(tmp_path, capsys):
    """--stalls: the stall counts (bits 41-44 of each instruction's second word) summed over the compared loop, and
    the part after its last MUFU.EX2; the instruction parse is the plain listing's; a listing without encodings is
    refused with --stalls."""
    loop = [("FFMA R3, R4, R5, -R6", 1), ("MUFU.EX2 R3, R3", 2), ("F2FP.BF16.F32.PACK_AB R8, R3, R3", 2),
            ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0", 9), ("@P2 BRA `(.L_x_5)", 5), ("EXIT", 1)]
    text = _hex_listing(loop)
    instrs, labels = sd.parse(text)
    assert [t for _, t in instrs] == [t for t, _ in loop]
    words = sd.control_words(text)
    assert [sd.stall(words[a]) for a, _ in instrs] == [s for _, s in loop]
    body = sd.loops(instrs, labels)[0]
    assert sd.stall_cycles(body, words) == (1 + 2 + 2 + 9 + 5, 2 + 9 + 5)
    assert sd.control_words(B) == {}
    a, b = tmp_path / "a.sass", tmp_path / "b.sass"
    a.write_text(text, encoding="utf-8")
    b.write_text(B, encoding="utf-8")
    assert sd.main([str(a), str(a), "--min-size", "2", "--stalls"]) == 0
    assert "stall cycles (static): A 19 (after the last MUFU.EX2 16), B 19 (after the last MUFU.EX2 16)" in \
        capsys.readouterr().out
    assert sd.main([str(a), str(b), "--min-size", "2", "--stalls"]) == 2
    assert "--stalls needs a listing with encodings" in capsys.readouterr().err
