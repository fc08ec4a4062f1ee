"""Small CIFAR data sets written in exactly the official archive format, for tests and the CPU demo.

Each class has its own coarse colour pattern (a random 4x4x3 grid blown up to 32x32) and every image is
that pattern plus noise and a brightness shift, so a small network learns it within a few epochs while
chance stays at 1/num_classes. The tar layout, pickle keys and dtypes are the published ones, so the
real reader (and torchvision) read these files unchanged.

That set is too easy to measure time to accuracy on (a ResNet-18 is at 1.0 after 3 epochs). ``difficulty`` (0..1)
makes the classes overlap, so a learning curve climbs over several epochs and stops well below 1: the classes
of one super-class (5 consecutive labels, as CIFAR-100's coarse labels) share a pattern, every image is blended
with a distractor class, has its own noise level and a small shift, and a few percent of the labels are wrong.
Its random draws come from a stream of their own, so difficulty 0 writes the original archive bit for bit.
"""

from __future__ import annotations

import io
import math
import os
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.data.cifar import LAYOUTS, pickle_bytes
from common.errors import DataError

# The difficulty terms at difficulty 1 (see Hardness), calibrated by training the cpu preset's ResNet-18: each term
# alone barely slows it (the class patterns are far apart), together they give a curve over several epochs.
SHARED_MAX = 0.9  # not 1: siblings stay apart even at difficulty 1
DISTRACTOR_MAX = 0.4  # below 0.5: an image always stays nearer its own class than its distractor
NOISE_MAX = 80.0
SHIFT_MAX = 2  # pixels; the training crop shifts by up to 4 more
LABEL_NOISE_MAX = 0.05  # a few percent at most: it caps accuracy without teaching anything
DIFFICULTY_STREAM = 0xD1F  # second seed word of the difficulty draws: apart from the original stream
SUPERCLASS_SIZE = 5  # consecutive labels that share a pattern under difficulty (CIFAR-100's coarse labels)


@dataclass(frozen=True)
class Hardness:
    """What ``difficulty`` does; each term scales linearly from nothing at 0 to its maximum at 1."""

    shared: float  # weight of the super-class pattern in every class prototype: confusable sibling classes
    distractor: float  # largest weight of a random other class's prototype mixed into one image
    noise: float  # largest per-image std (grey levels) of extra per-pixel Gaussian noise, on top of the original 28
    shift: int  # largest circular shift in pixels, each axis: the pattern is not pinned to one place
    label_noise: float  # fraction of labels replaced by a uniformly drawn class (both splits)


def hardness(difficulty: float) -> Hardness:
    """The generator's settings at ``difficulty`` in [0, 1]."""
    if not (math.isfinite(difficulty) and 0.0 <= difficulty <= 1.0):
        raise DataError(f"difficulty must be a number in [0, 1], got {difficulty}")
    return Hardness(shared=SHARED_MAX * difficulty, distractor=DISTRACTOR_MAX * difficulty,
                    noise=NOISE_MAX * difficulty, shift=math.floor(SHIFT_MAX * difficulty),
                    label_noise=LABEL_NOISE_MAX * difficulty)


def _prototypes(grid: np.ndarray) -> np.ndarray:
    """num_classes x 4 x 4 x 3 colour grid -> num_classes x 32 x 32 x 3 blocky patterns."""
    return grid.repeat(8, axis=1).repeat(8, axis=2)


def _shared_prototypes(rng: np.random.Generator, grid: np.ndarray, shared: float) -> np.ndarray:
    """Pulls each class's grid toward its super-class's own random grid: siblings become alike."""
    num_classes = len(grid)
    groups = -(-num_classes // SUPERCLASS_SIZE)
    super_grid = rng.integers(30, 226, size=(groups, *grid.shape[1:])).astype(np.float32)
    own = grid.astype(np.float32)
    return _prototypes((1.0 - shared) * own + shared * super_grid[np.arange(num_classes) // SUPERCLASS_SIZE])


def _class_images(rng: np.random.Generator, labels: np.ndarray, prototypes: np.ndarray) -> np.ndarray:
    """Float images before clipping: prototype, noise, brightness (the original draws, in the original order)."""
    base = prototypes[labels].astype(np.float32)  # N x 32 x 32 x 3
    noise = rng.normal(0.0, 28.0, size=base.shape).astype(np.float32)
    brightness = rng.normal(0.0, 12.0, size=(len(labels), 1, 1, 1)).astype(np.float32)
    return base + noise + brightness


def _harden(rng: np.random.Generator, images: np.ndarray, labels: np.ndarray, prototypes: np.ndarray,
            hard: Hardness) -> np.ndarray:
    """Mixes in a distractor class, adds noise and shifts each image; ``rng`` is the difficulty stream."""
    n, num_classes = len(labels), len(prototypes)
    others = (labels + rng.integers(1, num_classes, size=n)) % num_classes  # never the image's own class
    weight = rng.uniform(0.0, hard.distractor, size=(n, 1, 1, 1)).astype(np.float32)
    # own prototype -> distractor by ``weight``: the blend stays nearer its own class, yet overlaps its neighbours
    mixed = images + weight * (prototypes[others].astype(np.float32) - prototypes[labels].astype(np.float32))
    # per-image noise level, from clean to ``hard.noise``: easy and hard images side by side, so the curve climbs
    level = rng.uniform(0.0, hard.noise, size=(n, 1, 1, 1)).astype(np.float32)
    mixed += level * rng.standard_normal(size=mixed.shape, dtype=np.float32)
    shifts = rng.integers(-hard.shift, hard.shift + 1, size=(n, 2))
    moved = [np.roll(image, (int(dy), int(dx)), axis=(0, 1)) for image, (dy, dx) in zip(mixed, shifts, strict=True)]
    return np.stack(moved)


def _noisy_labels(rng: np.random.Generator, labels: np.ndarray, num_classes: int, fraction: float) -> np.ndarray:
    """``fraction`` of the labels redrawn uniformly (a redraw may land on the true class, as in real label noise)."""
    flip = rng.random(len(labels)) < fraction
    return np.where(flip, rng.integers(0, num_classes, size=len(labels)), labels)


def _to_uint8(images: np.ndarray) -> np.ndarray:
    return np.clip(images, 0, 255).astype(np.uint8)


def _to_rows(images: np.ndarray) -> np.ndarray:
    """N x 32 x 32 x 3 -> N x 3072 as R, G, B planes, the published row layout."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(images), 3072))


def _split(rng: np.random.Generator, n: int, num_classes: int, prototypes: np.ndarray,
           hard: tuple[np.random.Generator, Hardness] | None = None) -> tuple[np.ndarray, list[int]]:
    """One split's rows and labels; ``hard`` (the difficulty stream and settings) only above difficulty 0."""
    labels = np.arange(n) % num_classes  # balanced classes
    rng.shuffle(labels)
    images = _class_images(rng, labels, prototypes)
    if hard is not None:
        hard_rng, settings = hard
        images = _harden(hard_rng, images, labels, prototypes, settings)
        labels = _noisy_labels(hard_rng, labels, num_classes, settings.label_noise)
    return _to_rows(_to_uint8(images)), [int(x) for x in labels]


def _add(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(payload))


def write_cifar_archive(
    path: str | Path, kind: str = "cifar100", n_train: int = 5000, n_test: int = 1000, seed: int = 0,
    difficulty: float = 0.0,
) -> Path:
    """Writes ``kind`` (cifar100 or cifar10) as the official ``*-python.tar.gz``; returns the archive path.

    ``path`` is either the archive file to write or a folder to write it into under its official name.
    ``difficulty`` in [0, 1]: 0 is the original easy set, higher overlaps the classes more (see ``hardness``).
    """
    hard = hardness(difficulty)
    if kind not in LAYOUTS:
        raise DataError(f"unknown CIFAR kind '{kind}'; known: {', '.join(LAYOUTS)}")
    if n_train <= 0 or n_test <= 0:
        raise DataError(f"n_train and n_test must be positive, got {n_train} and {n_test}")
    layout = LAYOUTS[kind]
    path = Path(path)
    archive = path if path.name.endswith((".tar.gz", ".tgz")) else path / layout.archive_name
    archive.parent.mkdir(parents=True, exist_ok=True)

    rng = np.random.default_rng(seed)
    grid = rng.integers(30, 226, size=(layout.num_classes, 4, 4, 3)).astype(np.uint8)
    if difficulty == 0.0:  # the original archive, draw for draw
        prototypes = _prototypes(grid)
        train_rows, train_labels = _split(rng, n_train, layout.num_classes, prototypes)
        test_rows, test_labels = _split(rng, n_test, layout.num_classes, prototypes)
    else:
        hard_rng = np.random.default_rng((seed, DIFFICULTY_STREAM))
        prototypes = _shared_prototypes(hard_rng, grid, hard.shared)
        train_rows, train_labels = _split(rng, n_train, layout.num_classes, prototypes, (hard_rng, hard))
        test_rows, test_labels = _split(rng, n_test, layout.num_classes, prototypes, (hard_rng, hard))
    class_names = [f"class_{i:03d}" for i in range(layout.num_classes)]

    files: list[tuple[str, dict]] = []
    if kind == "cifar100":
        coarse = lambda labels: [y // 5 for y in labels]  # noqa: E731 - 20 super-classes of 5, as published
        for name, rows, labels in (("train", train_rows, train_labels), ("test", test_rows, test_labels)):
            files.append((name, {
                "filenames": [f"{name}_{i:06d}.png" for i in range(len(labels))],
                "batch_label": f"{name}ing batch 1 of 1",
                "fine_labels": labels,
                "coarse_labels": coarse(labels),
                "data": rows,
            }))
        files.append(("meta", {
            "fine_label_names": class_names,
            "coarse_label_names": [f"superclass_{i:02d}" for i in range(20)],
        }))
    else:
        chunks = np.array_split(np.arange(n_train), len(layout.train_files))
        for number, (name, chunk) in enumerate(zip(layout.train_files, chunks, strict=True), start=1):
            files.append((name, {
                "batch_label": f"training batch {number} of 5",
                "labels": [train_labels[i] for i in chunk],
                "data": train_rows[chunk],
                "filenames": [f"train_{i:06d}.png" for i in chunk],
            }))
        files.append(("test_batch", {
            "batch_label": "testing batch 1 of 1",
            "labels": test_labels,
            "data": test_rows,
            "filenames": [f"test_{i:06d}.png" for i in range(n_test)],
        }))
        files.append(("batches.meta", {"label_names": class_names, "num_cases_per_batch": 10000, "num_vis": 3072}))

    tmp = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")  # one per process: two may write the same archive
    with tarfile.open(tmp, "w:gz") as tar:
        folder = tarfile.TarInfo(layout.folder)
        folder.type = tarfile.DIRTYPE
        folder.mode = 0o755
        tar.addfile(folder)
        for name, content in files:
            _add(tar, f"{layout.folder}/{name}", pickle_bytes(content))
    os.replace(tmp, archive)
    return archive


# Text fixtures: the words of the generated sentences. Filler words are shared by every class (some with a comma,
# quotes or non-ASCII letters, so quoting and UTF-8 are exercised); each class has keywords of its own.
TEXT_FILLER = (
    "the", "a", "of", "to", "in", "and", "on", "for", "with", "said", "says", "after", "before", "new", "old",
    "year", "week", "today", "report", "people", "first", "last", "more", "than", "over", "under", "about",
    "could", "would", "will", "may", "its", "their", "this", "that", "from", "by", "at", "as", "is", "was",
    "officials,", "Monday,", "\"major\"", "café", "Zürich", "naïve", "São", "déjà", "—",
)
TEXT_KEYWORDS_PER_CLASS = 12
TEXT_KEYWORD_SHARE = 0.3  # of a sentence's words: enough for a small model to learn, never all of them
TEXT_WORDS_MEDIAN = 10.0  # lognormal word counts, as real text: most sentences short, a long tail
TEXT_WORDS_SIGMA = 0.65
TEXT_STREAM = 0x7E47  # second seed word of the keyword draws


def _text_keywords(seed: int, num_classes: int) -> list[list[str]]:
    """Distinct pseudo-words, TEXT_KEYWORDS_PER_CLASS per class, made of random syllables."""
    rng = np.random.default_rng((seed, TEXT_STREAM))
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    seen: set[str] = set(TEXT_FILLER)
    words: list[str] = []
    while len(words) < num_classes * TEXT_KEYWORDS_PER_CLASS:
        word = "".join(syllables[i] for i in rng.integers(0, len(syllables), size=int(rng.integers(2, 4))))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return [words[c * TEXT_KEYWORDS_PER_CLASS : (c + 1) * TEXT_KEYWORDS_PER_CLASS] for c in range(num_classes)]


def _text_rows(rng: np.random.Generator, n: int, keywords: list[list[str]],
               max_words: int) -> list[tuple[int, str, str]]:
    """(0-based label, title, description) rows: a few words of title, the rest description."""
    num_classes = len(keywords)
    labels = np.arange(n) % num_classes  # balanced classes
    rng.shuffle(labels)
    counts = np.clip(np.rint(rng.lognormal(np.log(TEXT_WORDS_MEDIAN), TEXT_WORDS_SIGMA, size=n)), 3, max_words)
    rows = []
    for label, count in zip(labels, counts.astype(int), strict=True):
        is_key = rng.random(count) < TEXT_KEYWORD_SHARE
        key = rng.integers(0, TEXT_KEYWORDS_PER_CLASS, size=count)
        filler = rng.integers(0, len(TEXT_FILLER), size=count)
        words = [keywords[label][k] if use else TEXT_FILLER[f] for use, k, f in zip(is_key, key, filler, strict=True)]
        cut = max(1, min(count // 3, 8))  # titles are short, descriptions carry the rest
        words[0] = words[0][:1].upper() + words[0][1:]  # a title's capital, the other words as they are
        rows.append((int(label), " ".join(words[:cut]), " ".join(words[cut:])))
    return rows


def write_text_fixture(folder: str | Path, fmt: str = "agnews", n_train: int = 2000, n_test: int = 500, seed: int = 0,
                       num_classes: int = 4, max_words: int = 80) -> Path:
    """Writes a small text classification set in a real format; returns the folder.

    ``fmt="agnews"``: ``train.csv`` / ``test.csv`` as AG News publishes them (no header, every field quoted,
    classes 1..num_classes, class, title, description). ``fmt="jsonl"``: ``train.jsonl`` / ``test.jsonl`` with
    ``text`` (title + " " + description) and an integer ``label`` from 0. Each class has its own keywords among
    shared filler words, so it is learnable; word counts are lognormal (median ~10, clipped to 3..max_words), so
    byte lengths run from ~20 to a few hundred with a long tail, as real text does. Deterministic by ``seed``.
    """
    import csv
    import json

    if fmt not in ("agnews", "jsonl"):
        raise DataError(f"unknown text fixture format '{fmt}'; known: agnews, jsonl")
    if n_train <= 0 or n_test <= 0 or num_classes < 2 or max_words < 3:
        raise DataError(f"text fixture needs n_train, n_test > 0, num_classes >= 2, max_words >= 3; got {n_train}, "
                        f"{n_test}, {num_classes}, {max_words}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    keywords = _text_keywords(seed, num_classes)
    for split, n in (("train", n_train), ("test", n_test)):
        rows = _text_rows(rng, n, keywords, max_words)
        if fmt == "agnews":
            with (folder / f"{split}.csv").open("w", encoding="utf-8", newline="") as stream:
                writer = csv.writer(stream, quoting=csv.QUOTE_ALL, lineterminator="\n")
                writer.writerows((label + 1, title, description) for label, title, description in rows)
        else:
            with (folder / f"{split}.jsonl").open("w", encoding="utf-8") as stream:
                for label, title, description in rows:
                    stream.write(json.dumps({"text": f"{title} {description}", "label": label}, ensure_ascii=False))
                    stream.write("\n")
    return folder
