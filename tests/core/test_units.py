import pytest

from gaplan.core.errors import GaplanError
from gaplan.core.options import OptionError
from gaplan.core.units import format_bytes, parse_bytes


@pytest.mark.parametrize("text, value", [("2GiB", 2 * 2**30), ("1.5GB", 1_500_000_000), ("800M", 800 * 2**20),
                                         ("512mib", 512 * 2**20), ("1073741824", 2**30), ("64 KiB", 65536)])
def test_parse(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["0", "abc", "-1GiB", "2XB", "", "0.0001", "nanGiB", "inf", 0, -1, True, 1.5, None])
def test_parse_rejects_naming_the_argument_as_the_caller_wrote_it(text):
    with pytest.raises(OptionError, match="^memory_limit must be") as caught:
        parse_bytes(text)
    assert caught.value.for_cli().startswith("--memory-limit must be")  # what the command line prints


def test_the_cpu_budget_and_the_lightning_callback_refuse_a_bad_limit_when_called():
    import gaplan
    from gaplan.integrations.lightning import GaplanBatchSize

    for bad in (-1, 0, "abc"):
        with pytest.raises(GaplanError, match="^memory_limit must be"):
            gaplan.cpu_budget(bad)
    with pytest.raises(GaplanError, match=r"^memory_limit must be a size .* \(got 'lots'\)"):
        GaplanBatchSize(effective_batch=8, memory_limit="lots")  # at construction, not at the first fit
    assert GaplanBatchSize(effective_batch=8, memory_limit="1GiB").memory_limit == 2**30


def test_format():
    assert format_bytes(2**30) == "1.00 GiB" and format_bytes(512) == "512 B" and format_bytes(None) == "-"
