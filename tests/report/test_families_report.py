"""The report's "Decoder against encoder" section, from made-up rows of +experiment=decoder_vs_encoder: one line
per framework and mode, the decoder's numbers beside the encoder's, and their ratios; nothing without both."""

from __future__ import annotations

from tests.support import build_report, trial, write_csv

OPT = {"model": "opt_125m", "n_params": 57_000_000}
BERT = {"model": "bert_base", "n_params": 52_000_000}
LLAMA = {"model": "smollm2_135m", "n_params": 56_000_000}


def rows(models=(BERT, OPT)) -> list[dict]:
    out = []
    for fw in ("torch", "jax"):
        for mode in ("backprop", "jvp"):
            for m in models:
                scale = {"opt_125m": 2.0, "smollm2_135m": 3.0}.get(m["model"], 1.0)  # the decoders', made up
                out.append(
                    trial(
                        fw,
                        mode,
                        experiment="decoder_vs_encoder",
                        num_layers=4,
                        excess_mem_mb=100.0 * scale,
                        step_time_median_s=0.5 * scale,
                        **m,
                    )
                )
    return out


def section(md: str) -> str:
    start = md.index("## Decoder against encoder")
    end = md.find("\n## ", start + 1)
    return md[start : end if end > 0 else None]


def test_each_mode_sets_the_decoder_beside_the_encoder_with_ratios(tmp_path):
    build_report([write_csv(tmp_path / "runs.csv", rows())], tmp_path / "out")
    text = section((tmp_path / "out" / "report.md").read_text())
    assert "bert_base 52.0 M parameters, opt_125m 57.0 M parameters, 4 layers each" in text
    lines = [line for line in text.splitlines() if line.startswith("| PyTorch") or line.startswith("| JAX")]
    assert [line.split(" | ")[:2] for line in lines] == [
        ["| PyTorch", "backprop"],
        ["| PyTorch", "jvp"],
        ["| JAX", "backprop"],
        ["| JAX", "jvp"],
    ]
    for line in lines:  # bert's excess and step, opt's, then the two ratios
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[3] == "100" and cells[4] == "500" and cells[6] == "200" and cells[7] == "1000", cells
        assert cells[-2:] == ["2.00×", "2.00×"], cells


def test_no_section_without_both_families(tmp_path):
    build_report([write_csv(tmp_path / "runs.csv", rows(models=(BERT,)))], tmp_path / "out")
    assert "## Decoder against encoder" not in (tmp_path / "out" / "report.md").read_text()


def test_each_decoder_has_its_table_beside_the_encoder(tmp_path):
    build_report([write_csv(tmp_path / "runs.csv", rows(models=(BERT, OPT, LLAMA)))], tmp_path / "out")
    text = section((tmp_path / "out" / "report.md").read_text())
    assert "bert_base 52.0 M parameters, opt_125m 57.0 M parameters, smollm2_135m 56.0 M parameters" in text
    heads = [line for line in text.splitlines() if line.startswith("| framework")]
    assert [h.split(" | ")[2] for h in heads] == ["bert_base peak MiB"] * 2
    assert ["opt_125m excess MiB" in heads[0], "smollm2_135m excess MiB" in heads[1]] == [True, True]
    ratios = [line.strip("|").split("|")[-2:] for line in text.splitlines() if line.startswith("| JAX")]
    assert [[c.strip() for c in r] for r in ratios] == [["2.00×", "2.00×"]] * 2 + [["3.00×", "3.00×"]] * 2
