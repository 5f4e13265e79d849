# xgrammar's C++ core (the structured-output grammar engine), built from its PyPI source
# distribution. scripts/fetch_xgrammar.sh puts the sdist into the dependency cache
# (SALA_DEPS_DIR, default ~/.cache/sala-deps) and checks its sha256; scripts/install_deps.sh
# runs it, and configuring runs it too when the file is missing. The sdist is unpacked into
# the build tree and its cpp/*.cc compiled here as the static library `xgrammar` (not through
# xgrammar's own CMakeLists.txt, which adds -Werror -flto and wants the Python bindings'
# tvm_ffi); the Python bindings (cpp/tvm_ffi, nanobind) are left out.
set(SALA_XGRAMMAR_VERSION 0.2.8)
set(SALA_XGRAMMAR_SHA256 8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80)
include(${CMAKE_CURRENT_LIST_DIR}/pypi_file.cmake)
sala_pypi_file(xgrammar-${SALA_XGRAMMAR_VERSION}.tar.gz ${SALA_XGRAMMAR_SHA256} scripts/fetch_xgrammar.sh)
set(_xg_sdist "${SALA_DEPS_DIR}/xgrammar-${SALA_XGRAMMAR_VERSION}.tar.gz")

set(_xg_root "${CMAKE_BINARY_DIR}/_deps/xgrammar-${SALA_XGRAMMAR_VERSION}")
if(NOT EXISTS "${_xg_root}/.sala-unpacked")
  file(REMOVE_RECURSE "${_xg_root}")
  file(ARCHIVE_EXTRACT INPUT "${_xg_sdist}" DESTINATION "${CMAKE_BINARY_DIR}/_deps")
  file(TOUCH "${_xg_root}/.sala-unpacked")
endif()

file(GLOB_RECURSE _xg_sources CONFIGURE_DEPENDS "${_xg_root}/cpp/*.cc")
list(FILTER _xg_sources EXCLUDE REGEX "/cpp/tvm_ffi/")
add_library(xgrammar STATIC ${_xg_sources})
# xgrammar is C++17 code; its headers are included from the engine's C++20 too.
set_target_properties(xgrammar PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
target_include_directories(xgrammar SYSTEM PUBLIC "${_xg_root}/include")
target_include_directories(xgrammar SYSTEM PRIVATE "${_xg_root}/cpp")
target_include_directories(xgrammar SYSTEM PUBLIC "${_xg_root}/3rdparty/picojson"
                           "${_xg_root}/3rdparty/dlpack/include")
target_compile_definitions(xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
# Third-party code: optimised even in Debug builds (compiling grammars is its hot path), without
# debug info (a third of its compile time, 130 MB of archive), and its warnings are not ours.
target_compile_options(xgrammar PRIVATE -O2 -g0 -w)
# Sanitizer builds (SALA_SANITIZE, SALA_FUZZ) instrument xgrammar like our own code: the
# -fsanitize flags are directory-wide and reach this target too. Deliberately: under TSan,
# xgrammar's own threads and atomics (its compile thread pool, thread_safe_cache.h) must be
# instrumented, or TSan misses the ordering they give and reports races in our code that are
# none; under ASan, the buffers we hand it (token bitmasks) are written by its code, which
# only instrumented code has checked. Its code runs in the sanitizer test subsets
# (test_grammar, server.structured_output) without a report, so tests/sanitize/ lists nothing.
