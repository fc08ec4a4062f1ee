"""One data set, two loaders: sources, fixtures, deterministic augmentation, sampling, batch assembly."""

from common.data.batches import BatchMaker, make_sampler
from common.data.sampler import EpochSampler
from common.data.sources import KNOWN_SOURCES, Source, load_source
from common.errors import DataError

__all__ = ["BatchMaker", "DataError", "EpochSampler", "KNOWN_SOURCES", "Source", "load_source", "make_sampler"]
