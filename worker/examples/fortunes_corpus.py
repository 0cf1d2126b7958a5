"""A byte-level text corpus from Debian's `fortunes` package: every fortune of
/usr/share/games/fortunes (plain text, one fortune per "%" line), in file
order; every tenth fortune is held out for the test split. About 2 MB of
English prose, verse, quotes and definitions, so a small model learns
spelling, words and some syntax within minutes on a CPU."""

import pathlib

import numpy as np

DEFAULT_ROOT = pathlib.Path("/usr/share/games/fortunes")


def fortunes(root=DEFAULT_ROOT):
    """Every fortune as bytes, file by file in name order (no .dat indexes, no
    .u8 links, no offensive set)."""
    root = pathlib.Path(root)
    files = sorted(p for p in root.iterdir()
                   if p.is_file() and not p.is_symlink() and p.suffix == "")
    if not files:
        raise FileNotFoundError(f"no fortunes in {root}: install Debian's fortunes "
                                "(deploy/install-deps.sh does)")
    out = []
    for p in files:
        for text in p.read_bytes().split(b"\n%\n"):
            text = text.strip(b"%\n")
            if text:
                out.append(text + b"\n\n")
    return out


def load(split, root=DEFAULT_ROOT):
    """The bytes of split "train" (9 of every 10 fortunes) or "test" (the
    tenth) as one uint8 array."""
    texts = fortunes(root)
    keep = [t for i, t in enumerate(texts) if (i % 10 == 9) == (split == "test")]
    return np.frombuffer(b"".join(keep), dtype=np.uint8)
