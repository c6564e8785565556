"""The data source refuses a processor checkpoint whose _metadata names pickle
unless .option("allowPickle", "true") (docs/security.md): the checkpoint of
tests/checkpoint/test_processor_pickle.py, whose key ``b`` holds a pickle that
creates a marker file, creates none."""

from __future__ import annotations

import pytest

from spark_integration.datasource import register
from tests.checkpoint.test_processor_pickle import _tampered

pytestmark = pytest.mark.slow


def test_a_pickled_processor_store_is_refused_without_allow_pickle(spark, tmp_path):
    uri, marker = _tampered(tmp_path)
    register(spark)
    read = spark.read.format("sessionstore").option("path", uri).option("store", "processor")
    with pytest.raises(Exception) as caught:
        read.load().collect()
    message = str(caught.value)
    assert f"store 'processor' of {uri}/op is pickled" in message
    assert '.option("allowPickle", "true")' in message
    assert not marker.exists()
