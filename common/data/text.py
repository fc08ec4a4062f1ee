"""Text classification data for a variable-length workload: readers, a byte-level tokenizer, padding strategies.

Framework-free (numpy only), so both frameworks' loaders start from the same token arrays, as the image sources do.

Readers take the formats users already have, unchanged:

- AG News CSV (``train.csv`` / ``test.csv``): no header, rows ``"class","title","description"``, classes 1..N.
  Labels become 0..N-1 and the text is ``title + " " + description``. AG News escapes a newline as the two
  characters ``\\n`` (and a backslash as ``\\\\``); the first becomes a space, the second one backslash.
- JSON Lines (``train.jsonl`` / ``test.jsonl``): one object a line with ``text`` (str) and ``label`` (an int from
  0, or a string: the sorted set of the train split's strings is numbered 0..).

The tokenizer needs no download: UTF-8 bytes shifted past two special tokens. ``CLS`` at position 0 is what
"cls" pooling reads, and ``PAD`` = 0 is what the attention mask is built from (``mask = tokens != PAD``), so a
batch is just (tokens int32 [B, L], labels int32 [B]) and no mask array travels with it.

Batching strategies (``BATCHINGS``) decide only the padded length L of a batch, never which examples are in it
or their order (the sampler decides those), so a sweep over them compares the same optimisation steps:

- ``pad-max``: every batch padded to one length ``pad_to`` (one shape: one compilation, the most padding);
- ``pad-longest``: to the longest example in the batch (least padding, a new shape almost every batch);
- ``bucket``: to the smallest bucket size that holds the batch's longest (few shapes, little padding).
"""

from __future__ import annotations

import csv
import json
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from common.errors import ConfigError, DataError

PAD = 0
CLS = 1
BYTE_OFFSET = 2  # byte b is token b + 2: 0 and 1 are taken by PAD and CLS
VOCAB_SIZE = 256 + BYTE_OFFSET

FORMATS = {"agnews": "csv", "jsonl": "jsonl"}  # format -> file extension of its train/test files
SPLITS = ("train", "test")
AGNEWS_COLUMNS = 3  # class, title, description
BATCHINGS = ("pad-max", "pad-longest", "bucket")
POW2_SMALLEST = 16  # below this a bucket saves too little to be worth another shape


@dataclass(frozen=True)
class TextSplit:
    """One split as read: texts, 0-based int32 labels, the class count (fixed by the train split)."""

    texts: list[str]
    labels: np.ndarray
    num_classes: int
    format: str
    label_names: tuple[str, ...] = ()  # JSON Lines string labels, in label order; empty for integer labels


# ---------------------------------------------------------------- locating the files


def _split_files(folder: Path, fmt: str) -> dict[str, Path]:
    return {split: folder / f"{split}.{FORMATS[fmt]}" for split in SPLITS}


def locate(folder_or_file: str | Path) -> tuple[str, dict[str, Path]]:
    """(format, {split: file}) of a data set given as its folder or as one of its files.

    A file names its folder and, by its extension, the format: ``--data`` is one path for both splits, as a
    CIFAR archive is, so ``.../train.csv`` and ``.../test.csv`` both mean the AG News folder they are in.
    """
    path = Path(folder_or_file)
    looked_for = ", ".join(f"{split}.{ext}" for ext in FORMATS.values() for split in SPLITS)
    if path.is_file() or path.suffix in (".csv", ".jsonl"):
        fmt = next((f for f, ext in FORMATS.items() if path.suffix == f".{ext}"), None)
        if fmt is None:
            raise DataError(f"text data file {path} is neither .csv (AG News) nor .jsonl (JSON Lines)")
        return fmt, _split_files(path.parent, fmt)
    if not path.is_dir():
        raise DataError(f"text data folder {path} not found: expected a folder holding {looked_for}")
    found = [fmt for fmt in FORMATS if _split_files(path, fmt)["train"].is_file()]
    if not found:
        raise DataError(f"no text data set in {path}: looked for {looked_for}")
    if len(found) > 1:
        raise DataError(f"{path} holds both train.csv and train.jsonl: pass the file of the one to use")
    return found[0], _split_files(path, found[0])


def _open(file: Path) -> TextIO:
    if not file.is_file():
        raise DataError(f"text data file {file} not found (looked for {file.name} in {file.parent})")
    # utf-8-sig: a byte-order mark (spreadsheet exports) is not part of the first class or text
    return file.open(encoding="utf-8-sig", newline="")


# ---------------------------------------------------------------- AG News CSV

_AGNEWS_ESCAPE = re.compile(r"\\(\\|n)")


def unescape_agnews(field_text: str) -> str:
    """AG News's escapes undone in one pass: ``\\n`` -> space, ``\\\\`` -> one backslash; anything else stays."""
    return _AGNEWS_ESCAPE.sub(lambda m: "\\" if m.group(1) == "\\" else " ", field_text)


@contextmanager
def _no_field_limit() -> Iterator[None]:
    """The csv module's field size limit (128 KiB) lifted while a file is read: a long text is read whole and cut
    to max_len tokens like any other, not refused."""
    previous = csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def _read_agnews_rows(file: Path) -> tuple[list[str], list[int], list[int]]:
    """(texts, 1-based classes, line numbers) of one CSV file, each row checked; blank lines are skipped."""
    texts, classes, lines = [], [], []
    with _open(file) as stream, _no_field_limit():
        reader = csv.reader(stream)
        try:
            for row in reader:
                where = f"{file} line {reader.line_num}"
                if not row:
                    continue
                if len(row) != AGNEWS_COLUMNS:
                    raise DataError(f"{where}: expected {AGNEWS_COLUMNS} columns (class, title, description), "
                                    f"found {len(row)}")
                try:
                    klass = int(row[0])
                except ValueError:
                    raise DataError(f"{where}: class {row[0]!r} is not an integer") from None
                if klass < 1:
                    raise DataError(f"{where}: class {klass} is not valid: AG News classes start at 1")
                title, description = unescape_agnews(row[1]), unescape_agnews(row[2])
                if not (title.strip() or description.strip()):
                    raise DataError(f"{where}: empty text (title and description are both empty)")
                texts.append(f"{title} {description}")
                classes.append(klass)
                lines.append(reader.line_num)
        except csv.Error as exc:
            raise DataError(f"{file} line {reader.line_num}: not valid CSV ({exc})") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"{file}: not UTF-8 text ({exc})") from None
    if not texts:
        raise DataError(f"{file} holds no rows")
    return texts, classes, lines


def _read_agnews(files: dict[str, Path], split: str) -> TextSplit:
    train_texts, train_classes, _ = _read_agnews_rows(files["train"])
    num_classes = max(train_classes)  # the train split fixes the class count (AG News: 4)
    if split == "train":
        texts, classes = train_texts, train_classes
    else:
        texts, classes, lines = _read_agnews_rows(files[split])
        for klass, line in zip(classes, lines, strict=True):
            if klass > num_classes:
                raise DataError(f"{files[split]} line {line}: class {klass} is outside 1..{num_classes}, the classes "
                                f"of {files['train'].name}")
    return TextSplit(texts, np.asarray(classes, np.int32) - 1, num_classes, "agnews")


# ---------------------------------------------------------------- JSON Lines


def _read_jsonl_rows(file: Path) -> tuple[list[str], list[int | str], list[int]]:
    """(texts, raw labels, line numbers) of one JSON Lines file, each line checked; blank lines are skipped."""
    texts: list[str] = []
    labels: list[int | str] = []
    lines: list[int] = []
    with _open(file) as stream:
        try:
            for number, line in enumerate(stream, start=1):
                where = f"{file} line {number}"
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{where}: expected a JSON object with 'text' and 'label', found "
                                    f"{type(row).__name__}")
                missing = [key for key in ("text", "label") if key not in row]
                if missing:
                    raise DataError(f"{where}: the object lacks {' and '.join(repr(k) for k in missing)}")
                text, label = row["text"], row["label"]
                if not isinstance(text, str):
                    raise DataError(f"{where}: 'text' must be a string, found {type(text).__name__}")
                if not text.strip():
                    raise DataError(f"{where}: empty text")
                # bool is an int to Python, never a class number
                if isinstance(label, bool) or not isinstance(label, int | str):
                    raise DataError(f"{where}: 'label' must be an integer or a string, found {label!r}")
                if isinstance(label, int) and label < 0:
                    raise DataError(f"{where}: label {label} is negative: integer labels start at 0")
                texts.append(text)
                labels.append(label)
                lines.append(number)
        except UnicodeDecodeError as exc:
            raise DataError(f"{file}: not UTF-8 text ({exc})") from None
    if not texts:
        raise DataError(f"{file} holds no rows")
    return texts, labels, lines


def _read_jsonl(files: dict[str, Path], split: str) -> TextSplit:
    train_texts, train_labels, train_lines = _read_jsonl_rows(files["train"])
    strings = isinstance(train_labels[0], str)  # the first label decides; any other kind below is an error
    texts, raw, lines = (train_texts, train_labels, train_lines) if split == "train" else _read_jsonl_rows(files[split])
    if strings:
        names = tuple(sorted({str(label) for label in train_labels if isinstance(label, str)}))
        number = {name: i for i, name in enumerate(names)}
        for label, line in zip(raw, lines, strict=True):
            if not isinstance(label, str) or label not in number:  # the train split named its classes
                raise DataError(f"{files[split]} line {line}: label {label!r} is not one of the train split's "
                                f"labels ({', '.join(names)})")
        return TextSplit(texts, np.asarray([number[str(label)] for label in raw], np.int32), len(names), "jsonl",
                         names)
    num_classes = max(int(label) for label in train_labels if isinstance(label, int)) + 1
    for label, line in zip(raw, lines, strict=True):
        if not isinstance(label, int) or label >= num_classes:
            raise DataError(f"{files[split]} line {line}: label {label!r} is not one of the train split's classes "
                            f"0..{num_classes - 1}")
    return TextSplit(texts, np.asarray(raw, np.int32), num_classes, "jsonl")


def read_text_split(folder_or_file: str | Path, split: str) -> TextSplit:
    """One split of an AG News CSV or JSON Lines data set; the format is whichever train file exists.

    The test split is checked against the train split (its class count, its string labels), so both are read.
    """
    if split not in SPLITS:
        raise DataError(f"unknown split '{split}'; known: {', '.join(SPLITS)}")
    fmt, files = locate(folder_or_file)
    return _read_agnews(files, split) if fmt == "agnews" else _read_jsonl(files, split)


# ---------------------------------------------------------------- tokenizer


def encode(text: str, max_len: int) -> np.ndarray:
    """[CLS] + the UTF-8 bytes of ``text`` (each + 2), int32, cut to ``max_len`` tokens in all.

    The cut may split a multi-byte character: at byte level that is one more byte sequence, not an error.
    """
    if max_len < 1:
        raise DataError(f"max_len must be at least 1 (the CLS token), got {max_len}")
    data = np.frombuffer(text.encode("utf-8"), np.uint8)[: max_len - 1]
    tokens = np.empty(len(data) + 1, np.int32)
    tokens[0] = CLS
    tokens[1:] = data.astype(np.int32) + BYTE_OFFSET
    return tokens


# ---------------------------------------------------------------- source


class TextSource:
    """Encoded examples in memory: ``source[i] -> (int32 tokens of length lengths[i], int label)``.

    The same interface as the image sources (name, num_classes, synthetic, len, getitem), so the sampler and
    both loaders take it unchanged.
    """

    synthetic = False
    augmentations: tuple[str, ...] = ()  # a text is read as written

    def __init__(self, name: str, tokens: list[np.ndarray], labels: np.ndarray, num_classes: int, max_len: int,
                 format: str = "") -> None:
        if len(tokens) != len(labels):
            raise DataError(f"text source '{name}': {len(tokens)} token arrays but {len(labels)} labels")
        if not tokens:
            raise DataError(f"text source '{name}' is empty")
        self.name = name
        self.tokens = tokens
        self.labels = np.asarray(labels, np.int32)
        self.num_classes = num_classes
        self.max_len = max_len
        self.format = format
        self.lengths = np.asarray([len(t) for t in tokens], np.int32)
        if int(self.lengths.max()) > max_len:
            raise DataError(f"text source '{name}': an example of {int(self.lengths.max())} tokens is over "
                            f"max_len {max_len}")

    @classmethod
    def from_split(cls, split: TextSplit, max_len: int, name: str = "text") -> TextSource:
        return cls(name, [encode(text, max_len) for text in split.texts], split.labels, split.num_classes, max_len,
                   split.format)

    @property
    def longest(self) -> int:
        """Tokens in the longest example, after truncation to ``max_len``."""
        return int(self.lengths.max())

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.tokens[index], int(self.labels[index])


def load_text_source(path: str | Path, split: str, max_len: int = 256) -> TextSource:
    """The ``split`` of the AG News CSV or JSON Lines data set at ``path``, encoded and cut to ``max_len``."""
    if max_len < 2:
        raise DataError(f"max_len must be at least 2 (CLS and one byte), got {max_len}")
    return TextSource.from_split(read_text_split(path, split), max_len)


def shared_pad_to(*sources: TextSource) -> int:
    """pad-max's length for several splits: the longest example of any, so train and eval share one shape."""
    return max(source.longest for source in sources)


# ---------------------------------------------------------------- buckets and padding


def bucket_sizes(max_len: int, scheme: str | int) -> tuple[int, ...]:
    """Bucket lengths, ascending, the last one ``max_len``.

    ``"pow2"``: 16, 32, 64, ... up to ``max_len``; an int N: N, 2N, 3N, ... up to ``max_len``. ``max_len`` itself
    ends the list when the scheme does not land on it, so every example has a bucket. End them at pad-max's
    length (``pad_to``), not at a larger cap, or a bucket can be longer than pad-max pads to.
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ConfigError(f"bucket sizes need a positive max_len, got {max_len!r}")
    if scheme == "pow2":
        sizes, size = [], POW2_SMALLEST
        while size <= max_len:
            sizes.append(size)
            size *= 2
    elif isinstance(scheme, int) and not isinstance(scheme, bool) and scheme > 0:
        sizes = list(range(scheme, max_len + 1, scheme))
    else:
        raise ConfigError(f"unknown bucket scheme {scheme!r}: expected 'pow2' or a positive integer step")
    if not sizes or sizes[-1] != max_len:
        sizes.append(max_len)
    return tuple(sizes)


def parse_buckets(text: str, max_len: int) -> tuple[int, ...]:
    """Config text ``"pow2"`` or a step such as ``"8"`` / ``"32"`` -> ``bucket_sizes(max_len, ...)``."""
    cleaned = text.strip().lower()
    if cleaned == "pow2":
        return bucket_sizes(max_len, "pow2")
    if not cleaned.isdigit() or int(cleaned) == 0:
        raise ConfigError(f"buckets {text!r} not understood: expected 'pow2' or a positive integer step like '32'")
    return bucket_sizes(max_len, int(cleaned))


def _check_strategy(strategy: str) -> None:
    if strategy not in BATCHINGS:
        raise ConfigError(f"unknown batching '{strategy}'; known: {', '.join(BATCHINGS)}")


def padded_length(lengths: np.ndarray, strategy: str, pad_to: int, buckets: tuple[int, ...]) -> int:
    """The length a batch of examples of ``lengths`` is padded to under ``strategy``.

    Never shorter than the batch's longest example: a strategy that would cut tokens is a DataError, not a
    silent truncation (``max_len`` is where examples are cut, once, for every strategy alike).
    """
    _check_strategy(strategy)
    if len(lengths) == 0:
        raise DataError("an empty batch has no padded length")
    longest = int(np.max(lengths))
    if strategy == "pad-longest":
        return longest
    if strategy == "pad-max":
        if longest > pad_to:
            raise DataError(f"pad-max pads to {pad_to} tokens, but the batch holds an example of {longest}: "
                            "pad_to must be at least the longest example of every split (shared_pad_to)")
        return pad_to
    fitting = [size for size in buckets if size >= longest]
    if not fitting:
        raise DataError(f"no bucket holds an example of {longest} tokens (buckets {list(buckets)})")
    return min(fitting)


def collate(token_arrays: list[np.ndarray], length: int) -> np.ndarray:
    """int32 [B, length]: each array left-aligned, PAD on the right."""
    batch = np.full((len(token_arrays), length), PAD, np.int32)
    for row, tokens in enumerate(token_arrays):
        if len(tokens) > length:
            raise DataError(f"an example of {len(tokens)} tokens does not fit a batch padded to {length}")
        batch[row, : len(tokens)] = tokens
    return batch


@dataclass
class TextBatchMaker:
    """(epoch, indices) -> (tokens int32 [B, L], labels int32 [B]), the call ``BatchMaker`` answers for images.

    ``train``, ``seed`` and ``epoch`` change nothing (text has no augmentation here); they keep the signature the
    loaders call. ``pad_to`` (pad-max's length) defaults to the source's longest example; give the eval maker
    the train maker's (``shared_pad_to``) so both splits share a shape. ``buckets`` default to powers of two up
    to ``pad_to``.
    """

    source: TextSource
    train: bool
    seed: int = 0
    read_latency_ms: float = 0.0  # simulated storage latency per batch, as in BatchMaker
    batching: str = "pad-longest"
    buckets: tuple[int, ...] = ()
    pad_to: int = 0  # 0: the source's longest example

    def __post_init__(self) -> None:
        _check_strategy(self.batching)
        if self.pad_to == 0:
            self.pad_to = self.source.longest
        if not self.buckets:
            self.buckets = bucket_sizes(self.pad_to, "pow2")
        self.buckets = tuple(self.buckets)
        # Checked once here rather than mid-epoch: an example that no shape holds fails before any step runs.
        if self.batching == "pad-max" and self.pad_to < self.source.longest:
            raise DataError(f"pad-max length {self.pad_to} is shorter than this split's longest example "
                            f"({self.source.longest} tokens)")
        if self.batching == "bucket" and (list(self.buckets) != sorted(set(self.buckets))
                                          or self.buckets[0] < 1 or self.buckets[-1] < self.source.longest):
            raise DataError(f"buckets {list(self.buckets)} must be ascending positive lengths ending at or above "
                            f"the longest example ({self.source.longest} tokens)")

    def __call__(self, epoch: int, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.read_latency_ms:
            time.sleep(self.read_latency_ms / 1e3)
        chosen = [int(i) for i in indices]
        length = padded_length(self.source.lengths[chosen], self.batching, self.pad_to, self.buckets)
        tokens = collate([self.source.tokens[i] for i in chosen], length)
        return tokens, self.source.labels[chosen].astype(np.int32)


# ---------------------------------------------------------------- epoch statistics


@dataclass(frozen=True)
class ShapeStats:
    """What one epoch's batches cost in shapes and padding under one strategy."""

    lengths_seen: tuple[int, ...]  # distinct padded lengths in order of first appearance: the shapes compiled
    real_tokens: int  # tokens of the examples themselves (CLS included)
    padded_tokens: int  # B x L summed over the batches
    waste: float  # 1 - real / padded: the fraction of the computed positions that are padding


def epoch_shapes(source: TextSource, batch_indices: list[np.ndarray], strategy: str, buckets: tuple[int, ...],
                 pad_to: int) -> ShapeStats:
    """The shapes and padding of ``batch_indices`` (an epoch from the sampler) under ``strategy``, without
    building a batch."""
    seen: dict[int, None] = {}  # a dict keeps first-appearance order
    real = padded = 0
    for indices in batch_indices:
        lengths = source.lengths[np.asarray(indices, np.int64)]
        length = padded_length(lengths, strategy, pad_to, buckets)
        seen.setdefault(length, None)
        real += int(lengths.sum())
        padded += length * len(lengths)
    waste = 1.0 - real / padded if padded else 0.0
    return ShapeStats(tuple(seen), real, padded, waste)
