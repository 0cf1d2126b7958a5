#!/bin/sh
# Fails when a C file of the project differs from .clang-format (STYLE.md).
cd "$(dirname "$0")/.." || exit 2
files=$(git ls-files '*.c' '*.h' 2>/dev/null || find common proto server worker tests -name '*.[ch]')
exec clang-format --dry-run -Werror $files
