#!/usr/bin/env bash
# Installs the CUDA toolchain used to build cuda-hal (nvcc, NVVM, the CRT headers and
# cuda.h) from NVIDIA's PyPI wheels into a git-ignored folder, then prints the
# environment to use. Idempotent: a second run with the same pins returns at once.
#
#   eval "$(scripts/install-cuda-toolchain.sh)"
#
# Versions are pinned to CUDA 13.0 so that the PTX fallback is JIT-able by a 13.0 driver.
set -euo pipefail

CUDA_WHEEL_VERSION="${CUDA_WHEEL_VERSION:-13.0.88}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${CUDA_HAL_TOOLCHAIN_DIR:-$root/.toolchain}"
stamp="$dest/.installed-$CUDA_WHEEL_VERSION-nvtx"
packages=(
  "nvidia-cuda-nvcc==$CUDA_WHEEL_VERSION"
  "nvidia-nvvm==$CUDA_WHEEL_VERSION"
  "nvidia-cuda-crt==$CUDA_WHEEL_VERSION"
  "nvidia-cuda-runtime==$CUDA_WHEEL_VERSION"
  # NVTX as a shared library (libnvtx3interop.so.1) for the `nvtx` feature.
  "nvidia-nvtx-cu12==12.9.79"
)

if [ ! -f "$stamp" ]; then
  rm -rf "$dest/site"
  mkdir -p "$dest"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$dest/site" "${packages[@]}" >&2
  touch "$stamp"
  # A build made before nvcc was here embedded no kernels, and cargo would not run its
  # build script again for a file it was not told to watch: build.rs is always watched.
  touch "$root/build.rs"
fi

# The wheels unpack under site/nvidia/cu13 (13.x layout) or site/nvidia/cuda_* (12.x).
cuda_root=""
for candidate in "$dest/site/nvidia/cu13" "$dest/site/nvidia/cuda_nvcc"; do
  if [ -x "$candidate/bin/nvcc" ]; then cuda_root="$candidate"; break; fi
done
if [ -z "$cuda_root" ]; then
  echo "install-cuda-toolchain: nvcc not found under $dest/site" >&2
  exit 1
fi
chmod +x "$cuda_root"/bin/* "$cuda_root"/nvvm/bin/* 2>/dev/null || true

echo "export CUDA_PATH=\"$cuda_root\""
echo "export NVCC=\"$cuda_root/bin/nvcc\""
echo "export PATH=\"$cuda_root/bin:\$PATH\""
nvtx_lib="$dest/site/nvidia/nvtx/lib/libnvtx3interop.so.1"
if [ -f "$nvtx_lib" ]; then echo "export CUDA_HAL_NVTX_LIB=\"$nvtx_lib\""; fi
