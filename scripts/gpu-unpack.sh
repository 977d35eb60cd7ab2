#!/usr/bin/env bash
# Unpacks the executables that scripts/gpu-pack.sh compressed (so that the bundle fits one
# 64 MiB carry), ON THE GPU MACHINE. Called by gpu-run.sh and gpu-sanitize.sh; a second
# call finds nothing to do.
#
#   scripts/gpu-unpack.sh [bundle]     (default: .gpu-bundle)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bundle="${1:-${GPU_BUNDLE:-.gpu-bundle}}"
[ -d "$bundle" ] || { echo "gpu-unpack: $bundle/ not found" >&2; exit 2; }
while IFS= read -r -d '' gz; do
  gzip -d -f "$gz"
  chmod +x "${gz%.gz}"
done < <(find "$bundle" -type f -name '*.gz' -print0)
# The executables gpu-pack.sh compressed with xz, through Python's lzma (the machine may
# have no xz).
find "$bundle" -type f -name '*.xz' ! -name '*.tar.xz' -print0 | python3 -c '
import lzma, os, shutil, sys
for path in filter(None, sys.stdin.buffer.read().split(b"\0")):
    out = path[:-3]
    with lzma.open(path) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.chmod(out, 0o755)
    os.remove(path)
'
# The executables of each build (<build>.tar.xz, examples.tar.xz) and the doc examples
# (doctests.tar.xz: <bundle>/doctests/<source file and line>/rust_out). Python's tarfile,
# in case the machine has no xz.
for archive in "$bundle"/*.tar.xz; do
  [ -f "$archive" ] || continue
  name="$(basename "$archive" .tar.xz)"
  [ "$name" = examples ] || rm -rf "${bundle:?}/$name"
  python3 -c '
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    try:
        t.extractall(sys.argv[2], filter="data")
    except TypeError:  # a Python without extraction filters
        t.extractall(sys.argv[2])
' \
    "$archive" "$bundle"
  rm -f "$archive"
done
