import pytest

from common.quantity import QuantityError, format_milli, parse_milli, parse_units


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        ("100m", 100),
        ("1", 1000),
        ("0.5", 500),
        ("2.25", 2250),
        ("1k", 1_000_000),
        ("1e3", 1_000_000),
        (2, 2000),
    ],
)
def test_parse_milli(text: str, milli: int) -> None:
    assert parse_milli(text) == milli


@pytest.mark.parametrize(
    ("text", "units"),
    [("1Ki", 1024), ("128Mi", 128 * 2**20), ("1.5Gi", 3 * 2**29), ("1G", 10**9), ("500m", 1), ("110", 110)],
)
def test_parse_units_rounds_up(text: str, units: int) -> None:
    assert parse_units(text) == units


@pytest.mark.parametrize("bad", ["1.5.3Gi", "", "abc", "1Qi", "--1", "1 Gi", True, None])
def test_malformed_quantities_raise_with_the_text(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_units(bad)  # type: ignore[arg-type]


def test_format_milli() -> None:
    assert format_milli(1500) == "1500m"
    assert format_milli(2000) == "2"
