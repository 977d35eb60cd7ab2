#!/usr/bin/env bash
# Unpacks the executables that scripts/gpu-pack.sh gzipped (so that the bundle fits one
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
