#!/usr/bin/env bash
# Build the variants of docs/design.md "Compiled core" in a scratch directory and run
# tools/compiled_core/bench_wheel.py on them: the wheel pure, compiled by mypyc, by
# Cython from the .py alone and with wheel_cython.pxd; and the three data-structure
# prototypes (dict + heap, linked list + heap, dict + bitmask), pure and compiled.
# Needs mypy and Cython (pip install mypy cython) and a C compiler. Usage:
#   bash tools/compiled_core/run.sh [compilers|structures] [bench_wheel.py options]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
what="${1:-compilers}"; shift || true
out="$(mktemp -d)"
echo "building in $out" >&2
mkdir -p "$out/mypyc/aiowheel" "$out/cython" "$out/cython_pxd" "$out/proto/pw"
cp "$root/aiowheel/_wheel.py" "$out/mypyc/aiowheel/_wheel.py"
touch "$out/mypyc/aiowheel/__init__.py" "$out/proto/pw/__init__.py"
cp "$root/aiowheel/_wheel.py" "$out/cython/wheel_cython_plain.py"
# A cdef class takes no decorator but its own: drop mypyc's.
grep -v '^@mypyc_attr' "$root/aiowheel/_wheel.py" > "$out/cython_pxd/wheel_cython.py"
cp "$here/wheel_cython.pxd" "$out/cython_pxd/"
cp "$here"/dict_heap.py "$here"/list_heap.py "$here"/dict_mask.py "$out/proto/pw/"
(cd "$out/mypyc" && mypyc aiowheel/_wheel.py >/dev/null)
(cd "$out/cython" && cythonize -i -3 wheel_cython_plain.py >/dev/null)
(cd "$out/cython_pxd" && cythonize -i -3 -X annotation_typing=False wheel_cython.py >/dev/null)
(cd "$out/proto" && mypyc pw/dict_heap.py pw/list_heap.py pw/dict_mask.py >/dev/null)
bench="$here/bench_wheel.py"
if [ "$what" = compilers ]; then
  python "$bench" pure="$root/aiowheel/_wheel.py" mypyc="aiowheel._wheel@$out/mypyc" \
    cython="wheel_cython_plain@$out/cython" cython_pxd="wheel_cython@$out/cython_pxd" "$@"
else
  python "$bench" \
    dict_heap="pw.dict_heap@$out/proto" list_heap="pw.list_heap@$out/proto" \
    dict_mask="pw.dict_mask@$out/proto" pure_dict_heap="$here/dict_heap.py" \
    pure_list_heap="$here/list_heap.py" pure_dict_mask="$here/dict_mask.py" "$@"
fi
