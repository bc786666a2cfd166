#!/usr/bin/env bash
# Installs a CUDA 13.0 toolchain from PyPI and link-time stub libraries, so that
# `cargo build --features cuda` works on a machine with no GPU and no system CUDA.
#
#   source scripts/cuda-toolchain.sh [DIR]     # DIR defaults to $KVBENCH_HOME/cuda-13.0
#
# It exports CUDA_ROOT/CUDA_PATH/CUDA_HOME, PATH (nvcc), CUDARC_CUDA_VERSION=13000 and, unless
# already set, CUDA_COMPUTE_CAP=90 (H100/H200; set it yourself for another GPU).
#
# Why 13.0: the GPU machines we verify on run the 580 driver series (CUDA 13.0), and PTX from a
# newer toolkit does not load on an older driver. The PyPI wheels must all be pinned to one
# release, or their dependencies drift to a newer one.
#
# Why stubs: candle-core's `cuda` feature links -lcuda -lcublas -lcublasLt -lcurand -lnvrtc
# -lcudart. The wheels carry libcudart and libnvrtc but no libcuda (it ships with the driver)
# and we do not download cuBLAS/cuRAND (~700 MB) only to link against them. For each missing
# library we compile a stub exporting every function cudarc declares for it, under the real
# soname (libcuda.so.1, libcublas.so.13, ...): the binary records that soname and, on a GPU
# machine, the loader resolves it to the real library. Stubs are found only at link time
# (lib/stubs under CUDA_ROOT, which cudarc's build script searches); nothing runs against them.
_kvb_cuda_main() {
    local data_home="${KVBENCH_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/kvbench}"
    local dir="${1:-$data_home/cuda-13.0}"
    local root="$dir/nvidia/cu13"
    local stamp="$dir/.kvbench-cuda-13.0.88"
    if [[ ! -f "$stamp" ]]; then
        echo "cuda-toolchain: installing the CUDA 13.0 toolchain wheels into $dir" >&2
        python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
            --target "$dir" \
            nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
            nvidia-cuda-runtime==13.0.88 nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-cccl==13.0.85 || return 1
        touch "$stamp"
    fi
    [[ -x "$root/bin/nvcc" ]] || { echo "cuda-toolchain: no nvcc under $root/bin" >&2; return 1; }

    # cudarc's source: its declarations are the list of symbols each stub must export.
    local cudarc
    # shellcheck disable=SC2016
    cudarc=$(cargo metadata --format-version 1 --features cuda 2>/dev/null | python3 -c '
import json, os, sys
pkgs = json.load(sys.stdin)["packages"]
print(next(os.path.dirname(p["manifest_path"]) for p in pkgs if p["name"] == "cudarc"))')
    local stubs="$root/lib/stubs"
    mkdir -p "$stubs"
    local spec lib soname mod
    for spec in "cuda libcuda.so.1 driver" "cublas libcublas.so.13 cublas" \
                "cublasLt libcublasLt.so.13 cublaslt" "curand libcurand.so.10 curand"; do
        read -r lib soname mod <<<"$spec"
        [[ -f "$stubs/lib$lib.so" ]] && continue
        sed -n 's/^pub unsafe fn \([A-Za-z0-9_]*\)(.*/void \1(void) {}/p' \
            "$cudarc/src/$mod/sys/mod.rs" | sort -u >"$stubs/$lib.c"
        [[ -s "$stubs/$lib.c" ]] || { echo "cuda-toolchain: no symbols for $lib in $cudarc" >&2; return 1; }
        gcc -shared -fPIC -Wl,-soname,"$soname" -o "$stubs/lib$lib.so" "$stubs/$lib.c" || return 1
    done
    # The wheels ship only versioned names; the linker asks for the plain ones.
    ln -sf ../libcudart.so.13 "$stubs/libcudart.so"
    ln -sf ../libnvrtc.so.13 "$stubs/libnvrtc.so"

    export CUDA_ROOT="$root" CUDA_PATH="$root" CUDA_HOME="$root"
    export PATH="$root/bin:$PATH"
    export CUDARC_CUDA_VERSION=13000
    export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
    echo "cuda-toolchain: $("$root/bin/nvcc" --version | tail -n 2 | head -n 1), CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP" >&2
}
_kvb_cuda_main "$@"
