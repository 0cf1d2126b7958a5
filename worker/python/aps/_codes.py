"""The layout of a tensor's codes in aps.Client's codes calls: where each
chunk's elements and bytes lie (struct aps_codes_layout, made Python)."""

from typing import NamedTuple


class CodesLayout(NamedTuple):
    """A tensor's codes chunk after chunk: count elements of format in chunks
    of chunk_elems (the last may be short), chunk i at byte i * chunk_bytes;
    block > 0: each chunk's codes are followed by one int8 exponent per block
    of block elements. bytes: all of them."""
    format: str
    count: int
    chunk_elems: int
    chunks: int
    block: int
    chunk_bytes: int
    bytes: int

    @classmethod
    def from_c(cls, c):
        return cls(c.format.decode(), c.count, c.chunk_elems, c.chunks, c.block,
                   c.chunk_bytes, c.bytes)

    def chunk(self, i):
        """Chunk i as (first element, elements, first byte, bytes)."""
        if not 0 <= i < self.chunks:
            raise IndexError(f"chunk {i} of {self.chunks}")
        start = i * self.chunk_elems
        at = i * self.chunk_bytes
        last = i + 1 == self.chunks
        return (start, self.count - start if last else self.chunk_elems, at,
                self.bytes - at if last else self.chunk_bytes)
