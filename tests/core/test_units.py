import pytest

from gaplan.core.errors import GaplanError
from gaplan.core.units import format_bytes, parse_bytes


@pytest.mark.parametrize("text, value", [("2GiB", 2 * 2**30), ("1.5GB", 1_500_000_000), ("800M", 800 * 2**20),
                                         ("512mib", 512 * 2**20), ("1073741824", 2**30), ("64 KiB", 65536)])
def test_parse(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["0", "abc", "-1GiB", "2XB", "", "0.0001"])
def test_parse_rejects(text):
    with pytest.raises(GaplanError, match="--memory-limit"):
        parse_bytes(text)


def test_format():
    assert format_bytes(2**30) == "1.00 GiB" and format_bytes(512) == "512 B" and format_bytes(None) == "-"
