#!/usr/bin/env bash
# Type-check tests/typing/user_program.py with mypy and pyright against the *installed*
# aiowheel, as a user's checker sees it (run it from outside the checkout, or with the
# package installed: an editable install must be visible to both). Each checker must
# report exactly the lines marked "# expect-error", and nothing else.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
program="$here/user_program.py"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Run from an empty directory, so that the checkout's aiowheel/ next to the current
# directory cannot stand in for the installed package.
cp "$program" "$work/"
cd "$work"
expected="$(grep -n '  # expect-error$' user_program.py | cut -d: -f1 | sort -n | tr '\n' ' ')"
status=0

mypy_out="$(python -m mypy --strict --no-incremental user_program.py 2>&1 || true)"
mypy_lines="$(grep -E '^user_program.py:[0-9]+: error' <<<"$mypy_out" | cut -d: -f2 | sort -nu | tr '\n' ' ' || true)"
if [[ "$mypy_lines" != "$expected" ]]; then
  echo "mypy: errors on lines [$mypy_lines], expected [$expected]:"; echo "$mypy_out"; status=1
fi

pyright_out="$(python -m pyright --pythonpath "$(command -v python)" user_program.py 2>&1 || true)"
pyright_lines="$(grep -E 'user_program.py:[0-9]+:[0-9]+ - error' <<<"$pyright_out" | sed -E 's/.*user_program.py:([0-9]+):.*/\1/' | sort -nu | tr '\n' ' ' || true)"
if [[ "$pyright_lines" != "$expected" ]]; then
  echo "pyright: errors on lines [$pyright_lines], expected [$expected]:"; echo "$pyright_out"; status=1
fi
[[ $status == 0 ]] && echo "typing: mypy and pyright see the typed API (lines $expected reported)"
exit $status
