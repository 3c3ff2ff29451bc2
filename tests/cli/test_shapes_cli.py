import json

import pytest

from te_gemm_callback.cli import main
from te_gemm_callback.shapes import (
    GemmOp,
    GemmShape,
    ModelConfig,
    backward_shapes,
    config_gemms,
    fprop_of,
    gemm_passes,
    parse_shapes,
    unique_shapes,
)

LLAMA3_8B = ["--hidden-size", "4096", "--intermediate-size", "14336", "--num-attention-heads", "32",
             "--num-key-value-heads", "8", "--gated-mlp", "--num-hidden-layers", "32",
             "--micro-batch-size", "1", "--sequence-length", "8192"]
CODONFM = ["--hidden-size", "4096", "--intermediate-size", "16384", "--num-attention-heads", "32",
           "--num-hidden-layers", "24", "--micro-batch-size", "31", "--sequence-length", "512"]


def test_backward_convention():
    f = GemmShape(512, 4096, 12288)
    d, w = backward_shapes(f)
    assert (d.m, d.k, d.n, d.op) == (512, 12288, 4096, GemmOp.DGRAD)  # M x N x K
    assert (w.m, w.k, w.n, w.op) == (4096, 512, 12288, GemmOp.WGRAD)  # K x M x N
    assert f.flops == d.flops == w.flops == 2 * 512 * 4096 * 12288
    assert fprop_of(d) == f and fprop_of(w) == f
    with pytest.raises(ValueError):
        backward_shapes(d)


def test_parse_and_dedupe():
    assert parse_shapes("8x16x32, 8x16x32,1x2x3") == [GemmShape(8, 16, 32)] * 2 + [GemmShape(1, 2, 3)]
    assert unique_shapes(parse_shapes("8x16x32,8x16x32")) == [GemmShape(8, 16, 32)]
    for bad in ("8x16", "axbxc", "0x1x1", ""):
        with pytest.raises(ValueError):
            parse_shapes(bad)


def run_json(capsys, args):
    assert main(["shapes", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_shapes_json_to_stdout_or_a_file_as_other_commands(tmp_path, capsys):
    """`--json -` (as the README says of every command), bare `--json`, or a file (table on stdout,
    the file replaced by a second run, a file of another kind refused)."""
    dash = run_json(capsys, LLAMA3_8B)
    assert main(["shapes", *LLAMA3_8B, "--json", "-"]) == 0
    bare = json.loads(capsys.readouterr().out)
    assert bare == dash and dash["schema"] == "te-gemm-shapes/1"
    out = tmp_path / "shapes.json"
    for _ in range(2):
        assert main(["shapes", *LLAMA3_8B, "--json", str(out)]) == 0
        assert "GEMM" in capsys.readouterr().out and json.loads(out.read_text()) == dash
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    assert main(["shapes", *LLAMA3_8B, "--json", str(notes)]) == 1 and notes.read_text() == "mine\n"


def test_llama3_8b_gqa_and_gated(capsys):
    out = run_json(capsys, LLAMA3_8B)
    by = {g["name"]: g["passes"][0] for g in out["gemms"]}
    assert (by["qkv"]["m"], by["qkv"]["k"], by["qkv"]["n"]) == (8192, 4096, 6144)  # (32 + 2*8) * 128
    assert (by["fc1"]["k"], by["fc1"]["n"]) == (4096, 2 * 14336)
    assert (by["fc2"]["k"], by["fc2"]["n"]) == (14336, 4096)
    out = run_json(capsys, LLAMA3_8B + ["--no-fused-gate-up", "--no-fused-qkv"])
    names = [g["name"] for g in out["gemms"]]
    assert names == ["q", "k", "v", "proj", "gate", "up", "fc2"]
    assert out["gemms"][1]["passes"][0]["n"] == 1024


def test_codonfm_gives_te_benchmark_12_shapes(capsys):
    out = run_json(capsys, CODONFM)
    shapes = [(p["op"], p["m"], p["k"], p["n"]) for g in out["gemms"] for p in g["passes"]]
    m, h, i = 31 * 512, 4096, 16384
    expected = []
    for f in (GemmShape(m, h, 3 * h), GemmShape(m, h, h), GemmShape(m, h, i), GemmShape(m, i, h)):
        expected += [(str(s.op), s.m, s.k, s.n) for s in gemm_passes(f)]
    assert shapes == expected and len(shapes) == 12


def test_moe_tp_and_lm_head():
    cfg = ModelConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, gated_mlp=True, num_experts=8, top_k=2,
                      tensor_parallel=2, vocab_size=32000, num_hidden_layers=2,
                      micro_batch_size=2, sequence_length=4096)
    g = {x.name: x for x in config_gemms(cfg)}
    tokens = 2 * 4096
    assert g["router"].fprop == GemmShape(tokens, 4096, 8)
    assert sum(g["fc1"].m_splits) == tokens * 2 and len(g["fc1"].m_splits) == 8
    assert g["fc1"].fprop.n == 14336  # 2I / TP
    assert g["fc2"].fprop.k == 7168  # row-parallel: K / TP
    assert g["qkv"].fprop.n == 3072 and g["proj"].fprop.k == 2048
    assert g["lm_head"].fprop.n == 16000 and not g["lm_head"].per_layer


def test_table_output(capsys):
    assert main(["shapes", *CODONFM]) == 0
    out = capsys.readouterr().out
    assert "15872x4096x12288" in out and "wgrad" in out


@pytest.mark.parametrize("args,needle", [
    (["--hidden-size", "-4"], "positive integer"),
    (LLAMA3_8B[:6] + ["--num-key-value-heads", "7"] + LLAMA3_8B[8:], "multiple of --num-key-value-heads"),
    (LLAMA3_8B + ["--num-experts", "4", "--top-k", "5"], "--top-k"),
])
def test_bad_input_one_line_exit_2(capsys, args, needle):
    rc = None
    try:
        rc = main(["shapes", *args])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and len(err.strip().splitlines()) == 1
