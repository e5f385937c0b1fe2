#!/usr/bin/env bash
# Build llama.cpp's llama-bench and llama-quantize (CPU plus one GPU backend) from the llama.cpp source
# vendored in llama-cpp-python's sdist, pinned to one version, outside the repository.
#
#     tools/build_llama_cpp.sh WORKDIR [vulkan|opencl]      # default: vulkan
#
# Needs cmake, ninja, a C++ compiler and, for vulkan, Vulkan's headers, glslc and SPIR-V headers (Debian:
# apt-get install libvulkan-dev glslc spirv-headers mesa-vulkan-drivers); for opencl, Debian's
# ocl-icd-opencl-dev opencl-headers pocl-opencl-icd.
# WORKDIR/src holds the unpacked sdist, WORKDIR/build-BACKEND the build; the binaries end in
# WORKDIR/build-BACKEND/bin. Every backend's build includes the CPU backend, so `llama-bench -dev none`
# on any of them is llama.cpp on the CPU. benchmarks/compare_llama_cpp.py runs them.
# JOBS (default 2) sets the parallel compile jobs; the compile runs under nice.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
WORKDIR=$(realpath -m "${1:?usage: $0 WORKDIR [vulkan|opencl]}")
BACKEND=${2:-vulkan}
JOBS=${JOBS:-2}
PYTHON=${PYTHON:-python}

case "$BACKEND" in
  vulkan) BACKEND_FLAGS=(-DGGML_VULKAN=ON) ;;
  opencl) BACKEND_FLAGS=(-DGGML_OPENCL=ON -DGGML_OPENCL_USE_ADRENO_KERNELS=OFF) ;;
  *) echo "unknown backend '$BACKEND' (vulkan or opencl)" >&2; exit 2 ;;
esac

SRC="$WORKDIR/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  mkdir -p "$WORKDIR/src"
  "$PYTHON" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" \
    -d "$WORKDIR/src"
  tar -xzf "$WORKDIR/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$WORKDIR/src"
fi

# llama.cpp passes validation-layer settings (VK_EXT_layer_settings, Vulkan headers 1.3.272+) to every
# instance it creates; they only matter with its validation build (GGML_VULKAN_VALIDATE). With older
# headers (Debian 12 has 1.3.239) the instance is created without them; nothing else changes.
VULKAN_CPP="$SRC/ggml/src/ggml-vulkan/ggml-vulkan.cpp"
if [ "$BACKEND" = vulkan ] && ! grep -qs LayerSettingEXT /usr/include/vulkan/vulkan_structs.hpp \
    && grep -q "vk::LayerSettingsCreateInfoEXT" "$VULKAN_CPP"; then
  echo "Vulkan headers without VK_EXT_layer_settings: creating llama.cpp's instance without layer settings"
  perl -0pi -e 's/    std::vector<vk::LayerSettingEXT> settings = \{.*?vk::LayerSettingsCreateInfoEXT layer_setting_info\(settings\);\n//s; s/extensions, &layer_setting_info\);/extensions);/' "$VULKAN_CPP"
fi

LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

BUILD="$WORKDIR/build-$BACKEND"
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF "${LAUNCHER[@]}" "${BACKEND_FLAGS[@]}"
nice -n 10 cmake --build "$BUILD" -j "$JOBS" --target llama-bench llama-quantize llama-server
echo "built $BUILD/bin/llama-bench, llama-quantize and llama-server (llama.cpp from llama-cpp-python $LLAMA_CPP_PYTHON_VERSION, $BACKEND)"
