"""docs/OPERATIONS.md keeps up with the daemon: every key `apsd --help` lists
has a row in its configuration table, with the same default."""

import re
import subprocess

import pytest

from sd_helpers import APSD, ROOT


def help_keys():
    text = subprocess.run([str(APSD), "--help"], capture_output=True, text=True,
                          timeout=10).stdout
    return dict(re.findall(r"^  --(\w+) .*?default ([^,\s]+)", text, re.M))


def doc_rows():
    text = (ROOT / "docs" / "OPERATIONS.md").read_text()
    return {m.group(1): m.group(2) for m in
            re.finditer(r"^\| `(\w+)` \|[^|]*\| ([^|]*) \|", text, re.M)}


def test_every_key_has_a_row():
    keys, rows = help_keys(), doc_rows()
    assert len(keys) > 10
    missing = sorted(k for k in keys if k not in rows)
    assert not missing, f"docs/OPERATIONS.md has no row for: {missing}"


@pytest.mark.parametrize("key", sorted(help_keys()))
def test_documented_default_matches_help(key):
    default = help_keys()[key]
    row = doc_rows().get(key)
    if row is None:
        pytest.skip("no row (test_every_key_has_a_row fails)")
    if default.startswith("("):  # "(automatic)", "(off)": the row says what empty means
        assert row.startswith("empty"), row
    else:
        assert row.strip("`") == default or row.startswith(f"`{default}`"), (key, row, default)
