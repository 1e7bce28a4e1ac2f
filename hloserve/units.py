"""The one byte-count formatter, in binary units (IEC 80000-13: KiB = 1024 bytes); no deps."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(nbytes: float, *, exact: bool = False) -> str:
    """``nbytes`` in binary units: ``"64 B"``, ``"1.5 KiB"`` (one decimal from KiB up to TiB);
    ``exact`` adds the count: ``"512 bytes"``, ``"3.0 MiB (3145728 bytes)"``."""
    value = float(nbytes)
    unit = _UNITS[0]
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            break
        value /= 1024
    if unit == "B":
        return f"{int(nbytes)} bytes" if exact else f"{value:.0f} B"
    short = f"{value:.1f} {unit}"
    return f"{short} ({int(nbytes)} bytes)" if exact else short


def format_size(nbytes: int) -> str:
    """``format_bytes(nbytes, exact=True)``: ``"3.0 MiB (3145728 bytes)"``, for error messages."""
    return format_bytes(nbytes, exact=True)
