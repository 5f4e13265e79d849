# CUTLASS/CuTe's C++ headers, from the PyPI wheel `nvidia-cutlass` (the headers are in it under
# cutlass_library/source/include; Debian has no CUTLASS). scripts/fetch_cutlass.sh puts the
# wheel into the dependency cache (SALA_DEPS_DIR, default ~/.cache/sala-deps) and checks its
# sha256; configuring runs it when the file is missing. Only the headers are unpacked, into the
# build tree; the interface target `sala_cutlass` adds them as system includes (their warnings
# are not ours). Used by the CUDA backend's Hopper FP8 GEMM (cuda_gemm_fp8_sm90.cu) only.
set(SALA_CUTLASS_VERSION 4.2.0.0)
set(SALA_CUTLASS_SHA256 f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6)
set(_ct_wheel "${SALA_DEPS_DIR}/nvidia_cutlass-${SALA_CUTLASS_VERSION}-py3-none-any.whl")

function(_sala_cutlass_wheel_ok out)
  set(${out} FALSE PARENT_SCOPE)
  if(EXISTS "${_ct_wheel}")
    file(SHA256 "${_ct_wheel}" h)
    if(h STREQUAL SALA_CUTLASS_SHA256)
      set(${out} TRUE PARENT_SCOPE)
    endif()
  endif()
endfunction()

_sala_cutlass_wheel_ok(_ct_ok)
if(NOT _ct_ok)
  message(STATUS "CUTLASS ${SALA_CUTLASS_VERSION}: fetching the nvidia-cutlass wheel from PyPI into ${SALA_DEPS_DIR}")
  execute_process(COMMAND bash "${SALA_SOURCE_DIR}/scripts/fetch_cutlass.sh" "${SALA_DEPS_DIR}"
                  RESULT_VARIABLE _ct_rc OUTPUT_QUIET)
  _sala_cutlass_wheel_ok(_ct_ok)
  if(NOT _ct_rc EQUAL 0 OR NOT _ct_ok)
    message(FATAL_ERROR "nvidia_cutlass-${SALA_CUTLASS_VERSION}-py3-none-any.whl (sha256 "
                        "${SALA_CUTLASS_SHA256}) is not in ${SALA_DEPS_DIR} and "
                        "scripts/fetch_cutlass.sh could not fetch it (it needs PyPI and python3-venv)")
  endif()
endif()

set(_ct_root "${CMAKE_BINARY_DIR}/_deps/cutlass-${SALA_CUTLASS_VERSION}")
if(NOT EXISTS "${_ct_root}/.sala-unpacked")
  file(REMOVE_RECURSE "${_ct_root}")
  file(ARCHIVE_EXTRACT INPUT "${_ct_wheel}" DESTINATION "${_ct_root}"
       PATTERNS "cutlass_library/source/include/*" "cutlass_library/source/tools/util/include/*")
  file(TOUCH "${_ct_root}/.sala-unpacked")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_ct_wheel}")

add_library(sala_cutlass INTERFACE)
target_include_directories(sala_cutlass SYSTEM INTERFACE
  "${_ct_root}/cutlass_library/source/include"
  "${_ct_root}/cutlass_library/source/tools/util/include")
