"""The one byte-count formatter: sizes in binary units (IEC 80000-13: KiB = 1024 bytes).

Dependency-free: every layer may import it.
"""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(nbytes: float, *, exact: bool = False) -> str:
    """``nbytes`` in binary units for people.

    Args:
        nbytes: a byte count.
        exact: add the exact count, for error messages that must name it: ``"512 bytes"``,
            ``"3.0 MiB (3145728 bytes)"``.

    Returns:
        ``"64 B"``, ``"1.5 KiB"``, ``"2.0 GiB"`` (one decimal from KiB up, TiB the largest
        unit), or the exact form.
    """
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


__all__ = ["format_bytes", "format_size"]
