"""The model families' section: each way of differentiating on each causal decoder beside the same on the encoder,
both frameworks, from `+experiment=decoder_vs_encoder` (their models differ, so the framework x mode tables put them
in separate contexts)."""

from __future__ import annotations

from pathlib import Path

from bench.report.section import Results, Section
from bench.report.tables import fmt_ratio, fmt_value, md_table, num
from bench.scenarios.model.select import experiment_of, framework_order, mode_order, variant, view
from bench.spec import FRAMEWORK_NAMES

EXPERIMENT = "decoder_vs_encoder"  # conf/experiment/decoder_vs_encoder.yaml
METRICS = (
    ("peak MiB", "peak_mem_mb", 1.0),
    ("excess MiB", "excess_mem_mb", 1.0),
    ("step ms", "step_time_median_s", 1e3),
)


def ratio(a: dict, b: dict, column: str) -> float | None:
    x, y = num(a, column), num(b, column)
    return x / y if x is not None and y and y > 0 and x >= 0 else None


class FamiliesSection(Section):
    """Per framework and mode: each decoder's and the encoder's memory and step time, and their ratios."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        rows = [r for r in view(results).sel.ok if experiment_of(r) == EXPERIMENT]
        models = sorted({r["model"] for r in rows})
        if len(models) < 2:
            return []
        cells = {(r["framework"], variant(r), r["model"]): r for r in rows}
        order = sorted({(framework_order(r["framework"]), mode_order(r), r["framework"], variant(r)) for r in rows})
        encoder, *decoders = models  # the experiment's encoder, bert_base, sorts before its decoders
        tables = []
        for decoder in decoders:  # one table a decoder, each beside the encoder
            head = ["framework", "mode"]
            for m in (encoder, decoder):
                head += [f"{m} {name}" for name, _, _ in METRICS]
            head += ["excess ×", "step ×"]
            body = []
            for *_, fw, mode in order:
                a, b = cells.get((fw, mode, decoder), {}), cells.get((fw, mode, encoder), {})
                line = [FRAMEWORK_NAMES.get(fw, fw), mode]
                for r in (b, a):
                    line += [fmt_value(num(r, column), scale) for _, column, scale in METRICS]
                line += [fmt_ratio(ratio(a, b, "excess_mem_mb")), fmt_ratio(ratio(a, b, "step_time_median_s"))]
                body.append(line)
            tables += [md_table(head, body, "ll" + "r" * (len(head) - 2)), ""]
        sizes = {r["model"]: r for r in rows}
        shape = rows[0]
        device = shape.get("device_name") or shape.get("device")
        params = ", ".join(f"{m} {fmt_value(num(sizes[m], 'n_params'), 1e-6)} M parameters" for m in models)
        return [
            "## Decoder against encoder",
            "",
            f"Rows of experiment `{EXPERIMENT}` (conf/experiment/decoder_vs_encoder.yaml): {params}, "
            f"{shape.get('num_layers')} layers each, batch {shape.get('batch_size')}, sequence "
            f"{shape.get('seq_len')}, {device}. The ratios divide the decoder's by the encoder's, mode by mode and "
            "framework by framework, one table a decoder. docs/models.md says what differs between them.",
            "",
            *tables,
        ]
