"""bench/data.py on its real code paths: tokenizer parity with transformers, exact padding, corpus determinism
across processes, byte-identical hand-off to torch and jax, learnability, AG News CSV parsing and errors."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from bench.data import (
    DataSpec,
    batches,
    data_spec,
    encode,
    fingerprint,
    load_dataset,
    load_tokenizer,
    make_batches,
    read_ag_news_csv,
    vocab_path,
)
from bench.errors import ConfigError
from bench.spec import BATCH_KEYS
from tests.support import REPO

SENTENCES = [
    "Wall St. Bears Claw Back Into the Black (Reuters) Reuters - Short-sellers, Wall Street's dwindling",
    "Héllo  wörld\tCAFÉ naïve résumé 東京 -- e-mail: x@y.com, $1.5bn (up 3%)!",
    "Unbelievably, the 2004 Olympics' quarterbacks re-tokenized the antidisestablishmentarianism.",
    "",
    "a " * 300,  # longer than any seq_len below: truncated
]


def test_tokenizer_matches_transformers():
    from transformers import BertTokenizerFast

    # Positional: transformers 4 calls it vocab_file, 5 calls it vocab; 5 silently ignores vocab_file=... and
    # builds a 5-token vocab, hence the length check.
    reference = BertTokenizerFast(str(vocab_path()), do_lower_case=True)
    assert len(reference) == 30522
    for seq_len in (8, 32, 128):
        ours = encode(load_tokenizer(seq_len), SENTENCES, seq_len)
        theirs = reference(SENTENCES, padding="max_length", truncation=True, max_length=seq_len)
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            np.testing.assert_array_equal(ours[key], np.array(theirs[key]), err_msg=f"{key} at seq_len={seq_len}")


def test_padding_truncation_and_mask_exact():
    tok = load_tokenizer(8)
    enc = encode(tok, ["hello world", "", "one two three four five six seven eight nine"], 8)
    assert all(a.dtype == np.int32 and a.shape == (3, 8) for a in enc.values())
    hello, world = tok.token_to_id("hello"), tok.token_to_id("world")
    np.testing.assert_array_equal(enc["input_ids"][0], [101, hello, world, 102, 0, 0, 0, 0])
    np.testing.assert_array_equal(enc["attention_mask"][0], [1, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(enc["input_ids"][1], [101, 102, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(enc["attention_mask"][1], [1, 1, 0, 0, 0, 0, 0, 0])
    # truncated to 6 words, [SEP] still last, nothing padded
    assert enc["input_ids"][2, 0] == 101 and enc["input_ids"][2, -1] == 102
    assert tok.decode(enc["input_ids"][2].tolist()) == "one two three four five six"
    np.testing.assert_array_equal(enc["attention_mask"][2], np.ones(8))
    assert not enc["token_type_ids"].any()
    # padding is exactly where the mask is 0
    np.testing.assert_array_equal(enc["input_ids"] == 0, enc["attention_mask"] == 0)


def test_batches_have_spec_keys_shapes_and_dtypes():
    out = make_batches(DataSpec(num_train=100, num_eval=50), batch_size=16, seq_len=32, seed=0, epochs=2)
    assert len(out) == 2 * (100 // 16)  # last partial batch dropped, per epoch
    for b in out:
        assert tuple(b) == BATCH_KEYS
        assert all(b[k].shape == (16, 32) and b[k].dtype == np.int32 for k in BATCH_KEYS[:3])
        assert b["labels"].shape == (16,) and b["labels"].dtype == np.int32
        assert set(np.unique(b["labels"])) <= {0, 1, 2, 3}
    test = make_batches(DataSpec(num_train=100, num_eval=50), batch_size=16, seq_len=32, seed=0, split="test")
    assert len(test) == 3  # 48 of 50 test samples; fixed order, independent of the seed
    assert fingerprint(test) == fingerprint(
        make_batches(DataSpec(num_train=100, num_eval=50), batch_size=16, seq_len=32, seed=7, split="test")
    )


def test_batch_order_deterministic_per_seed_and_differs_across_seeds_and_epochs():
    spec = DataSpec(num_train=64, num_eval=8)
    run = make_batches(spec, batch_size=8, seq_len=16, seed=3, epochs=2)
    assert fingerprint(run) == fingerprint(make_batches(spec, batch_size=8, seq_len=16, seed=3, epochs=2))
    assert fingerprint(run) != fingerprint(make_batches(spec, batch_size=8, seq_len=16, seed=4, epochs=2))
    epoch0, epoch1 = run[:8], run[8:]
    assert fingerprint(epoch0) != fingerprint(epoch1)
    # each epoch is a permutation of the same samples
    rows = [np.sort(np.concatenate([b["input_ids"] for b in e]).view(f"V{16 * 4}").ravel()) for e in (epoch0, epoch1)]
    np.testing.assert_array_equal(rows[0], rows[1])
    # the low-level iterator: (seed, epoch) picks the permutation
    enc = {k: np.arange(40, dtype=np.int32).reshape(10, 4) for k in BATCH_KEYS[:3]}
    labels = np.arange(10, dtype=np.int32)
    order = [
        np.concatenate([b["labels"] for b in batches(enc, labels, 5, seed, epoch)])
        for seed, epoch in ((0, 0), (0, 0), (1, 0), (0, 1))
    ]
    np.testing.assert_array_equal(order[0], order[1])
    assert not np.array_equal(order[0], order[2]) and not np.array_equal(order[0], order[3])


def test_synthetic_corpus_is_byte_identical_across_processes():
    """What 'both frameworks see byte-identical batches' means: each trial process rebuilds the batches from
    the seeds, so two fresh interpreters (other hash seeds) must produce the same bytes as this one."""
    spec = DataSpec(num_train=256, num_eval=64, seed=5)
    here = fingerprint(make_batches(spec, batch_size=32, seq_len=64, seed=1, epochs=2))
    code = (
        "from bench.data import DataSpec, make_batches, fingerprint; "
        "spec = DataSpec(num_train=256, num_eval=64, seed=5); "
        "print(fingerprint(make_batches(spec, batch_size=32, seq_len=64, seed=1, epochs=2)))"
    )
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO)}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == here
    assert fingerprint(make_batches(DataSpec(num_train=256, num_eval=64, seed=6), 32, 64, seed=1)) != fingerprint(
        make_batches(spec, 32, 64, seed=1)
    )


def test_synthetic_is_prefix_stable_and_balanced():
    small = load_dataset(DataSpec(num_train=40, num_eval=20))
    big = load_dataset(DataSpec(num_train=400, num_eval=20))
    assert big.train.texts[:40] == small.train.texts
    assert small.test.texts == big.test.texts  # num_train does not move the test split
    assert np.bincount(big.train.labels).tolist() == [100, 100, 100, 100]
    assert len(set(big.train.texts) & set(big.test.texts)) == 0


def test_batches_reach_torch_and_jax_byte_identical():
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    batch = make_batches(DataSpec(num_train=16, num_eval=8), batch_size=8, seq_len=16, seed=0)[0]
    for key, a in batch.items():
        t = torch.from_numpy(a)
        assert t.dtype == torch.int32 and t.numpy().tobytes() == a.tobytes(), key
        j = jnp.asarray(a)
        assert j.dtype == jnp.int32 and np.asarray(j).tobytes() == a.tobytes(), key


def _bag_of_words(ids: np.ndarray, vocab: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The binary (N, V) sample-by-word matrix as coordinates (rows, cols): each distinct word of each sample
    that is in `vocab`, special tokens left out. Sparse, because a dense (N, V) matmul runs on BLAS threads,
    which crawl when other jobs share this 2-core machine."""
    ids = np.sort(ids, axis=1)
    first = np.ones_like(ids, bool)
    first[:, 1:] = ids[:, 1:] != ids[:, :-1]
    cols = np.minimum(np.searchsorted(vocab, ids), len(vocab) - 1)
    keep = first & (vocab[cols] == ids) & (ids > 102)  # ids <= 102: [PAD], [unused*], [UNK], [CLS], [SEP]
    rows = np.broadcast_to(np.arange(len(ids))[:, None], ids.shape)
    return rows[keep], cols[keep]


def _spmm(rows: np.ndarray, cols: np.ndarray, m: np.ndarray, n: int, transpose: bool = False) -> np.ndarray:
    """x @ m (or x.T @ m) for the binary x with ones at (rows, cols) and n rows in the result."""
    src, dst = (rows, cols) if transpose else (cols, rows)
    return np.stack([np.bincount(dst, weights=m[src, k], minlength=n) for k in range(m.shape[1])], axis=1)


def test_synthetic_is_learnable_but_not_trivial():
    data = load_dataset(DataSpec(num_train=1000, num_eval=500))
    tok = load_tokenizer(64)
    train, test = encode(tok, data.train.texts, 64), encode(tok, data.test.texts, 64)
    assert train["attention_mask"].sum(1).max() < 64  # nothing truncated at 64
    vocab = np.unique(train["input_ids"])
    x_train, x_test = _bag_of_words(train["input_ids"], vocab), _bag_of_words(test["input_ids"], vocab)
    y, n = data.train.labels, len(data.train)
    w, b = np.zeros((len(vocab), 4)), np.zeros(4)
    for _ in range(300):  # softmax regression, full-batch gradient descent
        z = _spmm(*x_train, w, n) + b  # (N, 4)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(n), y] -= 1.0  # d(cross-entropy)/dz
        w -= 1.0 * (_spmm(*x_train, p, len(vocab), transpose=True) / n + 1e-3 * w)  # lr 1, small L2
        b -= 1.0 * p.mean(0)
    predicted = (_spmm(*x_test, w, len(data.test)) + b).argmax(1)
    accuracy = (predicted == data.test.labels).mean()
    assert 0.6 < accuracy < 0.95, accuracy  # chance is 0.25; measured 0.80-0.82 over data seeds 0-3


AG_ROWS = (
    '"3","Wall St. Bears Claw Back Into the Black (Reuters)","Reuters - Short-sellers, Wall Street\'s '
    'dwindling\\band of ultra-cynics, are seeing green again."\n'
    '"4","Say ""cheese"", Mars","A rover, a camera and a \\$2.5 billion\\\\budget.\\news at 11"\n'
    '"1","Line\nbreak","quoted, title spans two lines"\n'
    "2,Plain,unquoted fields work too\n"
)


def test_ag_news_csv_parsing(tmp_path):
    (tmp_path / "train.csv").write_text(AG_ROWS, encoding="utf-8")
    split = read_ag_news_csv(tmp_path / "train.csv")
    assert split.labels.tolist() == [2, 3, 0, 1] and split.labels.dtype == np.int32
    assert split.texts == (
        "Wall St. Bears Claw Back Into the Black (Reuters) Reuters - Short-sellers, Wall Street's dwindling "
        "band of ultra-cynics, are seeing green again.",
        'Say "cheese", Mars A rover, a camera and a $2.5 billion\\budget. news at 11',
        "Line\nbreak quoted, title spans two lines",
        "Plain unquoted fields work too",
    )
    # a directory with train.csv and test.csv; subsets are seeded and kept in file order
    (tmp_path / "test.csv").write_text(AG_ROWS, encoding="utf-8")
    data = load_dataset(DataSpec(name="ag_news", path=str(tmp_path), num_train=3, num_eval=None))
    assert len(data.train) == 3 and data.test.texts == split.texts
    via_file = load_dataset(DataSpec(name="ag_news", path=str(tmp_path / "train.csv"), num_train=3, num_eval=4))
    assert via_file.train.texts == data.train.texts and via_file.test.texts == data.test.texts  # test.csv beside it
    out = make_batches(DataSpec(name="ag_news", path=str(tmp_path), num_train=4, num_eval=4), 2, 32, seed=0)
    assert len(out) == 2 and sorted(np.concatenate([b["labels"] for b in out]).tolist()) == [0, 1, 2, 3]


def test_ag_news_single_file_carves_a_disjoint_test_split(tmp_path):
    rows = "".join(f'"{i % 4 + 1}","title {i}","description {i}"\n' for i in range(40))
    (tmp_path / "mine.csv").write_text(rows)
    data = load_dataset(DataSpec(name="ag_news", path=str(tmp_path / "mine.csv"), num_train=None, num_eval=10))
    assert len(data.train) == 30 and len(data.test) == 10
    assert not set(data.train.texts) & set(data.test.texts)


@pytest.mark.parametrize(
    "rows, line, what",
    [
        (
            '"1","a","b"\n"2","only two"\n',
            2,
            "2 columns; accepted: 3 columns: class index 1-4, title, description",
        ),
        ('"1","a","b"\n"1","multi\nline","x"\n"5","a","b"\n', 4, "class index 5 out of range; accepted: 1-4"),
        ('"World","a","b"\n', 1, "class index 'World' is not an integer; accepted: 1-4"),
        ('"1","a","b","c"\n', 1, "4 columns"),
        ('"1","a","b"\n"2","no closing quote,b\n', 2, "unexpected end of data; accepted: 3 columns"),
    ],
)
def test_ag_news_wrong_format_names_file_and_line(tmp_path, rows, line, what):
    path = tmp_path / "bad.csv"
    path.write_text(rows)
    with pytest.raises(ConfigError) as e:
        read_ag_news_csv(path)
    msg = str(e.value)
    assert "\n" not in msg and f"data.path={path}: line {line}: " in msg and what in msg, msg


def test_ag_news_without_a_source_says_what_to_do(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_dataset(DataSpec(name="ag_news"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("data=ag_news: no local CSV (data.path=null) and ")
    assert "pass data.path=/path/to/ag_news/train.csv (format: class index 1-4, title, description)" in msg
    with pytest.raises(ConfigError, match=r"^data.path=.*nowhere: no such file"):
        load_dataset(DataSpec(name="ag_news", path=str(tmp_path / "nowhere")))
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ConfigError, match="no rows"):
        load_dataset(DataSpec(name="ag_news", path=str(tmp_path / "empty.csv")))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: make_batches(DataSpec(), 8, 4, seed=0), "seq_len=4: accepted an integer in [8, 8192]"),
        (
            lambda: make_batches(DataSpec(), 8, 8193, seed=0),
            "seq_len=8193: accepted an integer in [8, 8192] (8192: the",
        ),
        (
            lambda: make_batches(DataSpec(num_train=10), 16, 32, seed=0),
            "batch_size=16: larger than data.num_train=10",
        ),
        (
            lambda: make_batches(DataSpec(num_eval=10), 16, 32, 0, split="test"),
            "batch_size=16: larger than data.num_eval",
        ),
        (lambda: make_batches(DataSpec(), 8, 32, seed=0, split="val"), "split='val': accepted: train, test"),
        (
            lambda: make_batches(DataSpec(name="imdb"), 8, 32, seed=0),
            "data=imdb: unknown data source; accepted: ag_news, ",
        ),
        (
            lambda: data_spec({"name": "synthetic", "num_train": None}),
            "data.num_train=null: the synthetic corpus needs",
        ),
        (lambda: data_spec({"name": "synthetic", "size": 3}), "data.size: unknown option; accepted: "),
        (lambda: load_tokenizer(8193), "seq_len=8193"),
    ],
)
def test_bad_values_are_one_line_config_errors(call, message):
    with pytest.raises(ConfigError) as e:
        call()
    assert "\n" not in str(e.value) and str(e.value).startswith(message), str(e.value)
