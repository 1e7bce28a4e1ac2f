"""hloserve.units.format_bytes: the one byte formatter (status tables, inspect, cache errors)."""

from __future__ import annotations

from hloserve.units import format_bytes


def test_short_form_in_binary_units() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(64) == "64 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 2**20) == "3.0 MiB"
    assert format_bytes(2 * 2**30) == "2.0 GiB"
    assert format_bytes(5 * 2**40) == "5.0 TiB"
    assert format_bytes(2**50) == "1024.0 TiB"


def test_exact_form_names_the_byte_count() -> None:
    assert format_bytes(512, exact=True) == "512 bytes"
    assert format_bytes(3 * 2**20, exact=True) == "3.0 MiB (3145728 bytes)"
    assert format_bytes(1024, exact=True) == "1.0 KiB (1024 bytes)"


def test_format_size_is_the_exact_form() -> None:
    from hloserve.units import format_size

    assert format_size(3 * 2**20) == format_bytes(3 * 2**20, exact=True)
