"""GPT-2's byte-level alphabet: each byte stands as one printable character in a vocab string."""

from __future__ import annotations


def _byte_to_char() -> list[str]:
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)}
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


BYTE_TO_CHAR: list[str] = _byte_to_char()
CHAR_TO_BYTE: dict[str, int] = {char: byte for byte, char in enumerate(BYTE_TO_CHAR)}


def bytes_to_chars(data: bytes) -> str:
    return "".join(BYTE_TO_CHAR[b] for b in data)


def chars_to_bytes(token: str, skip_unmapped: bool = False) -> bytes | None:
    """The bytes a vocab string stands for; None (or the mapped part) when a char is not in the alphabet."""
    out = bytearray()
    for char in token:
        byte = CHAR_TO_BYTE.get(char)
        if byte is None:
            if not skip_unmapped:
                return None
            continue
        out.append(byte)
    return bytes(out)
