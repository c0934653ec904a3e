"""The FP8 study's real-model path on the CPU without weights: a tiny random Llama (2 layers, GQA 2:1,
head_dim 64) carried through a folder of pieces (integrations.model_dir), its per-layer capture, the end-to-end
KL / top-1 / perplexity job on the FP8 emulation, the CLI on that folder, and --merge."""
import json

import pytest
import torch

pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from fa_variants import cli  # noqa: E402
from fa_variants.fp8 import study, study_model  # noqa: E402
from fa_variants.integrations import model_dir  # noqa: E402
from helpers import session_seed


FIRST_PARAGRAPH = study_model.TEXT.split("\n\n")[0]  # ~130 word-level tokens: keeps the emulation fast


def _words():
    return sorted(set(study_model.TEXT.replace("\n", " ").replace(",", " , ").replace(".", " . ").split()))


def _tiny_model(vocab_size: int) -> LlamaForCausalLM:
    torch.manual_seed(session_seed("test_fp8_study_model.tiny_model"))  # a module fixture's draw (helpers.session_seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=1024,
                      tie_word_embeddings=True, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # weights exactly float16, so the folder (float16) holds this very model
        for p in model.parameters():
            p.copy_(p.half().float())
    return model


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]"] + _words())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tok = _tokenizer()
    model = _tiny_model(len(tok))
    path = tmp_path_factory.mktemp("tiny_llama")
    model_dir.save_model_dir(model, path, tokenizer=tok, chunk_mib=0.25)
    return path, model


def test_model_dir_round_trip_and_missing_piece(rng_seed, folder, tmp_path):
    path, model = folder
    parts = sorted(path.glob("model.safetensors.part-*"))
    assert len(parts) >= 3  # the weights really were cut into pieces
    loaded, tok = model_dir.load_model_dir(path)
    ids = torch.randint(0, model.config.vocab_size, (1, 37), generator=torch.Generator().manual_seed(rng_seed))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=1e-5)
    assert tok is not None and tok("It was the best").input_ids[0] != 0
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in path.iterdir():
        if f != parts[1]:
            (broken / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ValueError, match=parts[1].name):
        model_dir.read_weights(broken)
    data = parts[1].read_bytes()  # same size, other bytes: the last byte's bits flipped (a 0 written there was
    (broken / parts[1].name).write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # no change where it was 0 already)
    with pytest.raises(ValueError, match="sha256"):
        model_dir.read_weights(broken)


def test_end_to_end_on_the_emulation(folder, tmp_path):
    path, _ = folder
    model, tok = model_dir.load_model_dir(path)
    ids = tok(FIRST_PARAGRAPH, return_tensors="pt").input_ids
    e2e = study_model.end_to_end(model, ids, use_kernel=False)
    rows = {r["method"]: r for r in e2e["rows"]}
    assert list(rows) == ["reference", "bf16", "fp8", "fp8-head"]
    ref, bf16, fp8 = rows["reference"], rows["bf16"], rows["fp8"]
    assert ref["kl_vs_reference_max"] == 0 and ref["top1_vs_reference"] == 1
    assert fp8["backend"] == "EMULATION" and "EMULATION" in e2e["what"]
    # FP8 attention moves the distribution more than bf16 attention does, and both move it
    assert 0 < bf16["kl_vs_reference_mean"] < fp8["kl_vs_reference_mean"] < 1
    assert all(len(v) == ids.shape[1] for v in e2e["kl_per_token"].values())
    assert all(1 < r["perplexity"] < 10 * model.config.vocab_size for r in rows.values())
    md = "\n".join(study_model.markdown(e2e, "the EMULATION"))
    assert "FP8 via the EMULATION" in md and md.count("| fa3-fp8") == 2
    assert study_model.plot(e2e, tmp_path, "emulation").name == "e2e_kl_per_token.png"
    with pytest.raises(ValueError, match="input_ids"):
        study_model.end_to_end(model, ids[0], use_kernel=False)


@pytest.mark.gpu
def test_end_to_end_on_the_kernels(folder):
    """The same job through fa3 (bf16) and the fa3-fp8 kernel on an sm_90 GPU."""
    if not study.kernels_available():
        pytest.skip("needs the fa3-fp8 kernel on an sm_90 GPU")
    path, _ = folder
    model, tok = model_dir.load_model_dir(path, device="cuda")
    ids = tok(FIRST_PARAGRAPH, return_tensors="pt").input_ids
    fixture = study_model.capture_layers(model, ids, text=FIRST_PARAGRAPH, model_name="tiny")
    assert fixture.q.shape[:2] == (2, 1) and fixture.q.device.type == "cpu"
    e2e = study_model.end_to_end(model, ids, use_kernel=True)
    rows = {r["method"]: r for r in e2e["rows"]}
    assert rows["bf16"]["backend"] == "fa3 kernel" and rows["fp8"]["backend"] == "fa3-fp8 kernel"
    assert 0 < rows["bf16"]["kl_vs_reference_mean"] < rows["fp8"]["kl_vs_reference_mean"] < 1


def test_cli_on_the_folder_then_merge(folder, tmp_path, capsys):
    path, _ = folder
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "merged"
    text = tmp_path / "text.txt"
    text.write_text(FIRST_PARAGRAPH, encoding="utf-8")
    assert cli.main(["fp8-study", "--backend", "emulation", "--sweeps", "layer", "--model-dir", str(path),
                     "--text-file", str(text), "--out", str(a)]) == 0
    out = capsys.readouterr().out
    assert "RMSE per layer" in out and "End to end on the real model" in out and "EMULATION" in out
    run = json.loads((a / "fp8_study.json").read_text(encoding="utf-8"))
    assert {r["layer"] for r in run["rows"]} == {0, 1} and run["e2e"]["layers"] == 2
    assert {p.name for p in a.glob("*.png")} == {"error_vs_layer.png", "e2e_kl_per_token.png"}
    assert cli.main(["fp8-study", "--backend", "emulation", "--sweeps", "seqlen", "--seqlens", "64", "--heads", "1",
                     "--head-dim", "64", "--no-e2e", "--out", str(b)]) == 0
    assert cli.main(["fp8-study", "--merge", str(a / "fp8_study.json"), str(b / "fp8_study.json"),
                     "--out", str(merged)]) == 0
    rows = json.loads((merged / "fp8_study.json").read_text(encoding="utf-8"))["rows"]
    assert {r["sweep"] for r in rows} == {"layer", "seqlen"} and {r["head_dim"] for r in rows} == {64}
    report = (merged / "fp8_study.md").read_text(encoding="utf-8")
    assert "Long-context drift" in report and "End to end on the real model" in report


def test_seeds_do_not_depend_on_the_split():
    whole = study.sweep_cases(["p", "head_dim"], quick=True, gpu=False)
    part = study.sweep_cases(["head_dim"], quick=True, gpu=False, head_dims=[256])
    assert part and part == [c for c in whole if c.sweep == "head_dim" and c.head_dim == 256]


def test_a_fixture_beside_a_model_keeps_the_end_to_end_part(folder, tmp_path, capsys):
    """--model-dir with --fixture: the fixture fed the per-layer sweep and the loaded model's end-to-end part was
    dropped without a word (e2e null, real_model null; a break-it pass, session 49). Now the layer sweep reads the
    fixture and the model runs the end-to-end part."""
    path, _ = folder
    model, tok = model_dir.load_model_dir(path)
    ids = tok(FIRST_PARAGRAPH, return_tensors="pt").input_ids
    fixture = study_model.capture_layers(model, ids, text=FIRST_PARAGRAPH, model_name="tiny")
    fixture_file = fixture.save(tmp_path / "fixture.pt.xz")
    text = tmp_path / "text.txt"
    text.write_text(FIRST_PARAGRAPH, encoding="utf-8")
    out = tmp_path / "out"
    assert cli.main(["fp8-study", "--backend", "emulation", "--sweeps", "layer", "--model-dir", str(path),
                     "--fixture", str(fixture_file), "--text-file", str(text), "--out", str(out)]) == 0
    run = json.loads((out / "fp8_study.json").read_text(encoding="utf-8"))
    assert {r["layer"] for r in run["rows"]} == {0, 1}
    assert run["e2e"] is not None and run["e2e"]["layers"] == 2 and str(path) in run["setup"]["real_model"]
    assert "End to end on the real model" in capsys.readouterr().out
