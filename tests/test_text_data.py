"""The text data layer: AG News CSV and JSON Lines read unchanged, the byte tokenizer, and the batching strategies
(same examples in the same order under each, only the padded length differs)."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from common.data.batches import make_sampler
from common.data.sources import Source
from common.data.text import (
    BATCHINGS,
    CLS,
    PAD,
    VOCAB_SIZE,
    TextBatchMaker,
    bucket_sizes,
    collate,
    encode,
    epoch_shapes,
    load_text_source,
    padded_length,
    parse_buckets,
    read_text_split,
    shared_pad_to,
)
from common.errors import ConfigError, DataError
from experiments.catalog.fixtures import write_text_fixture

MAX_LEN = 512  # above the fixture's longest example: nothing is cut, so padding is measured on whole texts


@pytest.fixture(scope="module")
def agnews_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_fixture(tmp_path_factory.mktemp("agnews"), fmt="agnews", n_train=1200, n_test=300, seed=3)


@pytest.fixture(scope="module")
def jsonl_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_fixture(tmp_path_factory.mktemp("jsonl"), fmt="jsonl", n_train=400, n_test=100, seed=4)


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return folder


# ---------------------------------------------------------------- readers


@pytest.mark.parametrize("split", ["train", "test"])
def test_agnews_fixture_reads_back_as_title_space_description_with_zero_based_labels(agnews_folder, split):
    with (agnews_folder / f"{split}.csv").open(encoding="utf-8", newline="") as stream:
        rows = list(csv.reader(stream))
    data = read_text_split(agnews_folder, split)
    assert data.format == "agnews"
    assert data.num_classes == 4
    assert data.labels.dtype == np.int32
    assert data.texts == [f"{title} {description}" for _, title, description in rows]
    np.testing.assert_array_equal(data.labels, [int(klass) - 1 for klass, _, _ in rows])
    assert set(data.labels.tolist()) == {0, 1, 2, 3}


def test_agnews_fixture_is_quoted_like_the_published_files(agnews_folder):
    first = (agnews_folder / "train.csv").read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith('"') and first.count('","') >= 2  # every field quoted, class first
    assert int(first.split('","')[0].strip('"')) in (1, 2, 3, 4)


@pytest.mark.parametrize("split", ["train", "test"])
def test_jsonl_fixture_reads_back_with_its_texts_and_labels(jsonl_folder, split):
    lines = (jsonl_folder / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    objects = [json.loads(line) for line in lines]
    data = read_text_split(jsonl_folder, split)
    assert data.format == "jsonl"
    assert data.num_classes == 4
    assert data.texts == [obj["text"] for obj in objects]
    np.testing.assert_array_equal(data.labels, [obj["label"] for obj in objects])
    assert any(not text.isascii() for text in data.texts)  # the fixture exercises UTF-8


def test_fixture_is_deterministic_by_seed(tmp_path):
    one = write_text_fixture(tmp_path / "one", seed=7, n_train=50, n_test=10)
    two = write_text_fixture(tmp_path / "two", seed=7, n_train=50, n_test=10)
    other = write_text_fixture(tmp_path / "other", seed=8, n_train=50, n_test=10)
    assert (one / "train.csv").read_bytes() == (two / "train.csv").read_bytes()
    assert (one / "train.csv").read_bytes() != (other / "train.csv").read_bytes()


def test_a_file_path_means_its_folder_so_one_path_serves_both_splits(agnews_folder):
    by_folder = read_text_split(agnews_folder, "test")
    by_train_file = read_text_split(agnews_folder / "train.csv", "test")
    assert by_train_file.texts == by_folder.texts
    np.testing.assert_array_equal(by_train_file.labels, by_folder.labels)


def test_agnews_escapes_become_a_space_and_a_backslash(tmp_path):
    # in the file: \n (a newline), \\ (a backslash), \\n (a backslash then n), \b (no escape: kept as is)
    folder = _write(tmp_path, "train.csv", '"2","Line one\\nline two","a \\\\ b, c\\\\n d\\band"\n"1","t","d"\n')
    data = read_text_split(folder, "train")
    assert data.texts[0] == "Line one line two a \\ b, c\\n d\\band"
    assert data.labels.tolist() == [1, 0]
    assert data.num_classes == 2


def test_csv_class_count_is_the_train_splits_largest_class(tmp_path):
    folder = _write(tmp_path, "train.csv", '"1","a","b"\n"3","c","d"\n')
    _write(folder, "test.csv", '"2","e","f"\n')
    assert read_text_split(folder, "test").num_classes == 3
    assert read_text_split(folder, "test").labels.tolist() == [1]


def test_jsonl_string_labels_are_numbered_in_sorted_order_of_the_train_split(tmp_path):
    lines = [{"text": "x", "label": "sports"}, {"text": "y", "label": "business"}, {"text": "z", "label": "world"}]
    folder = _write(tmp_path, "train.jsonl", "\n".join(json.dumps(obj) for obj in lines) + "\n")
    _write(folder, "test.jsonl", json.dumps({"text": "w", "label": "world"}) + "\n")
    train = read_text_split(folder, "train")
    assert train.labels.tolist() == [1, 0, 2]
    assert train.num_classes == 3 and train.label_names == ("business", "sports", "world")
    assert read_text_split(folder, "test").labels.tolist() == [2]


def test_jsonl_unknown_test_label_is_named(tmp_path):
    folder = _write(tmp_path, "train.jsonl", '{"text": "x", "label": "sports"}\n{"text": "y", "label": "world"}\n')
    _write(folder, "test.jsonl", '{"text": "x", "label": "sports"}\n{"text": "q", "label": "weather"}\n')
    with pytest.raises(DataError, match=r"test\.jsonl line 2: label 'weather' is not one of .*sports, world"):
        read_text_split(folder, "test")


GOOD_CSV = '"1","title","text"\n'
GOOD_JSONL = '{"text": "fine", "label": 0}\n'

BAD_INPUTS = {  # case: (file name, its content, the split read, what the message must say)
    "wrong column count": ("train.csv", GOOD_CSV + '"2","only a title"\n', "train",
                           r"train\.csv line 2: expected 3 columns .*found 2"),
    "class not an integer": ("train.csv", GOOD_CSV + '"sports","t","d"\n', "train",
                             r"train\.csv line 2: class 'sports' is not an integer"),
    "class 0": ("train.csv", GOOD_CSV + '"0","t","d"\n', "train", r"train\.csv line 2: class 0 is not valid"),
    "class above the train split's": ("test.csv", GOOD_CSV + '"2","t","d"\n', "test",
                                      r"test\.csv line 2: class 2 is outside 1\.\.1"),
    "csv empty text": ("train.csv", GOOD_CSV + '"1","",""\n', "train", r"train\.csv line 2: empty text"),
    "json not an object": ("train.jsonl", GOOD_JSONL + '["text", 1]\n', "train",
                           r"train\.jsonl line 2: expected a JSON object .*found list"),
    "json lacks a key": ("train.jsonl", GOOD_JSONL + '{"text": "no label"}\n', "train",
                         r"train\.jsonl line 2: the object lacks 'label'"),
    "json not json": ("train.jsonl", GOOD_JSONL + '{"text": \n', "train", r"train\.jsonl line 2: not valid JSON"),
    "json empty text": ("train.jsonl", GOOD_JSONL + '{"text": "  ", "label": 0}\n', "train",
                        r"train\.jsonl line 2: empty text"),
    "json label not int or str": ("train.jsonl", GOOD_JSONL + '{"text": "a", "label": 1.5}\n', "train",
                                  r"train\.jsonl line 2: 'label' must be an integer or a string"),
    "json label above the train split's": (
        "test.jsonl", GOOD_JSONL + '{"text": "a", "label": 1}\n', "test",
        r"test\.jsonl line 2: label 1 is not one of the train split's classes 0\.\.0"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_names_the_file_and_line(tmp_path, case):
    name, content, split, message = BAD_INPUTS[case]
    train_name = "train.csv" if name.endswith(".csv") else "train.jsonl"
    _write(tmp_path, train_name, GOOD_CSV if name.endswith(".csv") else GOOD_JSONL)
    _write(tmp_path, name, content)  # a train file replaces the good one; a test file is read against it
    with pytest.raises(DataError, match=message):
        read_text_split(tmp_path, split)


def test_missing_folder_or_train_file_says_which_files_were_looked_for(tmp_path):
    with pytest.raises(DataError, match=r"nowhere.*train\.csv, test\.csv, train\.jsonl, test\.jsonl"):
        read_text_split(tmp_path / "nowhere", "train")
    _write(tmp_path, "test.csv", GOOD_CSV)  # a test file alone is no data set
    with pytest.raises(DataError, match=r"no text data set in .*looked for train\.csv"):
        read_text_split(tmp_path, "test")


def test_missing_test_file_is_named(tmp_path):
    _write(tmp_path, "train.jsonl", GOOD_JSONL)
    with pytest.raises(DataError, match=r"test\.jsonl not found"):
        read_text_split(tmp_path, "test")


def test_unknown_split_and_unknown_file_type(tmp_path):
    _write(tmp_path, "train.csv", GOOD_CSV)
    with pytest.raises(DataError, match="unknown split 'val'"):
        read_text_split(tmp_path, "val")
    _write(tmp_path, "data.txt", "x")
    with pytest.raises(DataError, match=r"neither \.csv .* nor \.jsonl"):
        read_text_split(tmp_path / "data.txt", "train")


# ---------------------------------------------------------------- tokenizer and source


def test_encode_puts_cls_first_and_shifts_bytes_by_two():
    tokens = encode("Hi", 16)
    assert tokens.dtype == np.int32
    assert tokens.tolist() == [CLS, ord("H") + 2, ord("i") + 2]
    assert PAD == 0 and CLS == 1 and VOCAB_SIZE == 258


def test_encode_writes_non_ascii_as_its_utf8_bytes():
    assert encode("é€", 16).tolist() == [CLS] + [b + 2 for b in "é€".encode()]  # 2 + 3 bytes
    assert encode("\U0001F600", 8).tolist() == [CLS, 0xF0 + 2, 0x9F + 2, 0x98 + 2, 0x80 + 2]  # a 4-byte emoji
    assert encode("\xff", 4).tolist() == [CLS, 0xC3 + 2, 0xBF + 2]  # U+00FF is two bytes, not byte 255
    assert 0xFF + 2 == VOCAB_SIZE - 1  # the highest byte still has a token


def test_encode_truncates_to_max_len_tokens_in_all():
    assert encode("abcdef", 4).tolist() == [CLS, 99, 100, 101]
    assert encode("abcdef", 1).tolist() == [CLS]
    assert len(encode("é" * 10, 4)) == 4  # a cut inside a character is still 4 tokens
    with pytest.raises(DataError, match="max_len"):
        encode("a", 0)


def test_text_source_is_a_source_of_token_arrays(agnews_folder):
    source = load_text_source(agnews_folder, "train", max_len=64)
    split = read_text_split(agnews_folder, "train")
    assert isinstance(source, Source) and not source.synthetic
    assert len(source) == len(split.texts) and source.num_classes == 4 and source.format == "agnews"
    tokens, label = source[5]
    np.testing.assert_array_equal(tokens, encode(split.texts[5], 64))
    assert label == int(split.labels[5]) and isinstance(label, int)
    assert source.lengths.dtype == np.int32 and source.longest == 64 == int(source.lengths.max())
    np.testing.assert_array_equal(source.lengths, [len(encode(text, 64)) for text in split.texts])


def test_fixture_lengths_are_long_tailed(agnews_folder):
    lengths = load_text_source(agnews_folder, "train", MAX_LEN).lengths
    assert np.median(lengths) < lengths.max() / 3
    assert lengths.min() >= 10 and 200 <= lengths.max() <= MAX_LEN
    assert np.mean(lengths > 2 * np.median(lengths)) < 0.2  # a tail, not a second mode


# ---------------------------------------------------------------- buckets and padding


def test_bucket_sizes_pow2_and_steps_end_at_max_len():
    assert bucket_sizes(256, "pow2") == (16, 32, 64, 128, 256)
    assert bucket_sizes(200, "pow2") == (16, 32, 64, 128, 200)
    assert bucket_sizes(10, "pow2") == (10,)
    assert bucket_sizes(100, 32) == (32, 64, 96, 100)
    assert bucket_sizes(96, 32) == (32, 64, 96)


def test_parse_buckets_reads_config_text():
    assert parse_buckets("pow2", 64) == (16, 32, 64)
    assert parse_buckets(" 8 ", 20) == (8, 16, 20)
    assert parse_buckets("32", 64) == (32, 64)


@pytest.mark.parametrize("text", ["", "abc", "0", "-8", "pow3", "1.5", "16,32"])
def test_parse_buckets_rejects_bad_text(text):
    with pytest.raises(ConfigError, match="buckets .* not understood"):
        parse_buckets(text, 64)


def test_bucket_sizes_rejects_bad_scheme_and_max_len():
    with pytest.raises(ConfigError, match="unknown bucket scheme"):
        bucket_sizes(64, 0)
    with pytest.raises(ConfigError, match="positive max_len"):
        bucket_sizes(0, "pow2")


def test_padded_length_under_each_strategy():
    lengths = np.array([5, 17, 9], np.int32)
    buckets = (16, 32, 64)
    assert padded_length(lengths, "pad-longest", 64, buckets) == 17
    assert padded_length(lengths, "bucket", 64, buckets) == 32
    assert padded_length(lengths, "pad-max", 64, buckets) == 64
    with pytest.raises(DataError, match="pad-max pads to 10 tokens"):
        padded_length(lengths, "pad-max", 10, buckets)
    with pytest.raises(DataError, match="no bucket holds an example of 17"):
        padded_length(lengths, "bucket", 64, (8, 16))
    with pytest.raises(ConfigError, match="unknown batching 'sorted'"):
        padded_length(lengths, "sorted", 64, buckets)


def test_collate_pads_on_the_right_with_pad():
    batch = collate([np.array([1, 5, 6], np.int32), np.array([1], np.int32)], 4)
    assert batch.dtype == np.int32
    assert batch.tolist() == [[1, 5, 6, PAD], [1, PAD, PAD, PAD]]
    with pytest.raises(DataError, match="does not fit"):
        collate([np.array([1, 5, 6], np.int32)], 2)


def test_batch_maker_refuses_a_shape_that_would_cut_examples(agnews_folder):
    source = load_text_source(agnews_folder, "train", MAX_LEN)
    with pytest.raises(DataError, match="shorter than this split's longest"):
        TextBatchMaker(source, train=True, batching="pad-max", pad_to=source.longest - 1)
    with pytest.raises(DataError, match="buckets"):
        TextBatchMaker(source, train=True, batching="bucket", buckets=(16, 32))
    with pytest.raises(ConfigError, match="unknown batching"):
        TextBatchMaker(source, train=True, batching="sorted")


@pytest.fixture(scope="module")
def epoch(agnews_folder):
    """The train source, the eval source, one training epoch's batches, pad-max's length and the buckets."""
    train = load_text_source(agnews_folder, "train", MAX_LEN)
    test = load_text_source(agnews_folder, "test", MAX_LEN)
    pad_to = shared_pad_to(train, test)
    return train, test, make_sampler(train, 32, seed=0, train=True).batches(1), pad_to, parse_buckets("pow2", pad_to)


def test_every_strategy_gives_the_same_examples_in_the_same_order(epoch):
    train, _, batches, pad_to, buckets = epoch
    made = {s: [TextBatchMaker(train, True, seed=0, batching=s, buckets=buckets, pad_to=pad_to)(1, idx)
                for idx in batches] for s in BATCHINGS}
    for i, indices in enumerate(batches):
        longest = int(train.lengths[indices].max())
        reference_tokens, reference_labels = made["pad-longest"][i]
        np.testing.assert_array_equal(reference_labels, train.labels[indices])
        np.testing.assert_array_equal((reference_tokens != PAD).sum(axis=1), train.lengths[indices])  # mask = != PAD
        for strategy in BATCHINGS:
            tokens, labels = made[strategy][i]
            assert tokens.dtype == np.int32 and labels.dtype == np.int32
            np.testing.assert_array_equal(labels, reference_labels)
            np.testing.assert_array_equal(tokens[:, :longest], reference_tokens)  # same rows, same order
            assert not tokens[:, longest:].any()  # everything past the longest is PAD
            assert (tokens[:, 0] == CLS).all()


def test_strategies_differ_only_in_padded_length_as_specified(epoch):
    train, _, batches, pad_to, buckets = epoch
    shapes = {s: [TextBatchMaker(train, True, batching=s, buckets=buckets, pad_to=pad_to)(1, idx)[0].shape[1]
                  for idx in batches] for s in BATCHINGS}
    assert set(shapes["pad-max"]) == {pad_to}
    assert shapes["pad-longest"] == [int(train.lengths[idx].max()) for idx in batches]
    assert set(shapes["bucket"]) <= set(buckets) and len(set(shapes["bucket"])) <= len(buckets)
    assert all(longest <= bucket for longest, bucket in zip(shapes["pad-longest"], shapes["bucket"], strict=True))
    assert len(set(shapes["pad-longest"])) > len(set(shapes["bucket"])) > 1  # the reason buckets exist
    for strategy in BATCHINGS:  # the statistics agree with the batches really made
        stats = epoch_shapes(train, batches, strategy, buckets, pad_to)
        assert stats.lengths_seen == tuple(dict.fromkeys(shapes[strategy]))
        assert stats.padded_tokens == sum(len(idx) * n for idx, n in zip(batches, shapes[strategy], strict=True))


def test_padding_waste_orders_pad_max_then_bucket_then_pad_longest(epoch):
    train, _, batches, pad_to, buckets = epoch
    stats = {s: epoch_shapes(train, batches, s, buckets, pad_to) for s in BATCHINGS}
    assert {st.real_tokens for st in stats.values()} == {int(train.lengths.sum())}  # the same tokens under each
    assert stats["pad-max"].waste > stats["bucket"].waste > stats["pad-longest"].waste > 0
    for st in stats.values():
        assert st.waste == pytest.approx(1 - st.real_tokens / st.padded_tokens)


def test_eval_maker_shares_pad_max_length_with_train(epoch):
    train, test, _, pad_to, buckets = epoch
    indices = make_sampler(test, 64, seed=0, train=False).batches(0)
    maker = TextBatchMaker(test, train=False, batching="pad-max", buckets=buckets, pad_to=pad_to)
    assert {maker(0, idx)[0].shape[1] for idx in indices} == {pad_to}
    assert pad_to == max(train.longest, test.longest)


def test_bucket_batches_are_cut_within_a_length_bucket_and_cover_the_epoch_once(tmp_path):
    """The training sampler of bucket batching: every example once an epoch (the other strategies' epochs see the
    same examples), each batch from one bucket (so it pads to that bucket only), at most one padded length a bucket,
    far less padding than batches cut across lengths, and a new order each epoch, the same for a seed."""
    from common.config import RunConfig
    from common.data.batches import loader_sampler
    from common.workloads import loader_options

    source = load_text_source(write_text_fixture(tmp_path, n_train=400, n_test=10, seed=5), "train", max_len=256)
    text = RunConfig(model="text-tiny", source="text", batch_size=16, seed=3)
    options = loader_options(text.replace(batching="bucket", buckets="pow2", max_len=256), train=True)
    sampler = loader_sampler(source, options, train=True)
    buckets = parse_buckets("pow2", source.longest)
    batches = sampler.batches(0)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(source)))
    shuffled = loader_sampler(source, loader_options(text, train=True), train=True)  # pad-longest
    assert sorted(shuffled.indices(0).tolist()) == sorted(sampler.indices(0).tolist())
    for batch in batches:  # one bucket a batch
        assert len({int(np.searchsorted(buckets, n)) for n in source.lengths[batch]}) == 1
    stats = epoch_shapes(source, batches, "bucket", buckets, source.longest)
    mixed = epoch_shapes(source, shuffled.batches(0), "bucket", buckets, source.longest)
    assert len(stats.lengths_seen) <= len(buckets) and stats.waste < 0.6 * mixed.waste
    assert [b.tolist() for b in sampler.batches(1)] != [b.tolist() for b in batches]
    assert [b.tolist() for b in loader_sampler(source, options, train=True).batches(1)] == [
        b.tolist() for b in sampler.batches(1)]
    # two ranks of 16 together see the global batches of 32 that one process would see
    ranks = [loader_sampler(source, replace(options, rank=r, world_size=2), train=True).batches(0) for r in (0, 1)]
    whole = loader_sampler(source, replace(options, batch_size=32), train=True).batches(0)
    assert [np.concatenate(pair).tolist() for pair in zip(*ranks, strict=True)] == [b.tolist() for b in whole]
