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


# Values a tenant can put in a pod (or a node's status) that must end as QuantityError, never another exception.
HOSTILE = [
    pytest.param("1e999999", id="exponent-beyond-decimal-context"),
    pytest.param("1e2147483647", id="exponent-int32-max"),
    pytest.param("1e2147483648", id="exponent-beyond-int32"),
    pytest.param("1e-2147483649", id="negative-exponent-beyond-int32"),
    pytest.param("1e" + "9" * 200, id="exponent-of-200-digits"),
    pytest.param("9" * 25, id="25-digits"),
    pytest.param("9" * 300, id="longer-than-max-text"),
    pytest.param("1" * 5000, id="5000-digits"),
    pytest.param("9223372036854775808", id="int64-max-plus-one-units"),
    pytest.param("8Ei", id="8Ei-above-int64"),
    pytest.param("99999999999Ei", id="huge-binary"),
    pytest.param("10E", id="10E-above-int64"),
    pytest.param("NaN", id="nan"),
    pytest.param("nan", id="nan-lower"),
    pytest.param("Infinity", id="infinity"),
    pytest.param("inf", id="inf"),
    pytest.param("-inf", id="minus-inf"),
    pytest.param("sNaN", id="snan"),
    pytest.param("١٢", id="arabic-indic-digits"),
    pytest.param("１２", id="fullwidth-digits"),
    pytest.param("1\u00a0Gi", id="nbsp"),
    pytest.param("1_000", id="underscore"),
    pytest.param("0x10", id="hex"),
    pytest.param("1e", id="dangling-exponent"),
    pytest.param("e3", id="no-mantissa"),
    pytest.param(".", id="lone-dot"),
    pytest.param("1..2", id="two-dots"),
    pytest.param("--1", id="two-signs"),
    pytest.param("1Gi\n2", id="newline-inside"),
    pytest.param(float("inf"), id="float-inf"),
    pytest.param(float("-inf"), id="float-minus-inf"),
    pytest.param(float("nan"), id="float-nan"),
    pytest.param(1e20, id="float-1e20"),
    pytest.param(1e308, id="float-1e308"),
    pytest.param(2**64, id="int-2-64"),
    pytest.param(10**5000, id="int-of-5001-digits"),
    pytest.param(-(10**5000), id="negative-int-of-5001-digits"),
    pytest.param([1], id="list"),
    pytest.param({"cpu": 1}, id="mapping"),
    pytest.param(b"1", id="bytes"),
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_quantities_in_milli_units_are_quantity_errors(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_milli(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_quantities_in_units_are_quantity_errors(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_units(value)  # type: ignore[arg-type]


def test_the_int64_bound_is_inclusive_in_the_unit_returned() -> None:
    assert parse_units("9223372036854775807") == 2**63 - 1
    assert parse_milli("9223372036854775807m") == 2**63 - 1
    assert parse_milli("9223372036854775.807") == 2**63 - 1
    with pytest.raises(QuantityError, match="out of range"):
        parse_milli("9223372036854775.808")
    assert parse_units("-9223372036854775808") == -(2**63)
    assert parse_units("7Ei") == 7 * 2**60
    assert parse_units("1E") == 10**18
    with pytest.raises(QuantityError, match="out of range"):
        parse_milli("1E")  # 10**21 milli-units


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        ("1e-999999", 1),  # tiny positive: rounds up to the smallest unit, as Kubernetes rounds up to 1n
        ("0." + "0" * 200 + "1", 1),
        ("-1e-40", 0),
        ("1e+3", 1_000_000),
        ("+1", 1000),
        (".5", 500),
        ("5.", 5000),
        (" 2 ", 2000),
        ("0", 0),
        ("0e999999", 0),  # zero of any exponent is zero, not an overflow
        ("0.1" + "0" * 38 + "1", 101),  # exact: not rounded to 28 digits before rounding up
    ],
)
def test_edge_quantities_that_parse(text: str, milli: int) -> None:
    assert parse_milli(text) == milli


def test_out_of_range_errors_quote_the_text_but_not_a_huge_number() -> None:
    with pytest.raises(QuantityError) as e:
        parse_units(10**5000)
    assert len(str(e.value)) < 200
    with pytest.raises(QuantityError) as e:
        parse_units("1" * 100_000)
    assert len(str(e.value)) < 200
