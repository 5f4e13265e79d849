# CUTLASS/CuTe's C++ headers, from the PyPI wheel `nvidia-cutlass` (the headers are in it under
# cutlass_library/source/include; Debian has no CUTLASS). scripts/fetch_cutlass.sh puts the
# wheel into the dependency cache (SALA_DEPS_DIR, default ~/.cache/sala-deps) and checks its
# sha256; configuring runs it when the file is missing. Only the headers are unpacked, into the
# build tree; the interface target `sala_cutlass` adds them as system includes (their warnings
# are not ours). Used by the CUDA backend's Hopper FP8 GEMM (cuda_gemm_fp8_sm90.cu) only.
set(SALA_CUTLASS_VERSION 4.2.0.0)
set(SALA_CUTLASS_SHA256 f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6)
include(${CMAKE_CURRENT_LIST_DIR}/pypi_file.cmake)
set(_ct_name "nvidia_cutlass-${SALA_CUTLASS_VERSION}-py3-none-any.whl")
sala_pypi_file(${_ct_name} ${SALA_CUTLASS_SHA256} scripts/fetch_cutlass.sh)
set(_ct_wheel "${SALA_DEPS_DIR}/${_ct_name}")

set(_ct_root "${CMAKE_BINARY_DIR}/_deps/cutlass-${SALA_CUTLASS_VERSION}")
if(NOT EXISTS "${_ct_root}/.sala-unpacked")
  file(REMOVE_RECURSE "${_ct_root}")
  file(ARCHIVE_EXTRACT INPUT "${_ct_wheel}" DESTINATION "${_ct_root}"
       PATTERNS "cutlass_library/source/include/*" "cutlass_library/source/tools/util/include/*")
  file(TOUCH "${_ct_root}/.sala-unpacked")
endif()

add_library(sala_cutlass INTERFACE)
target_include_directories(sala_cutlass SYSTEM INTERFACE
  "${_ct_root}/cutlass_library/source/include"
  "${_ct_root}/cutlass_library/source/tools/util/include")
