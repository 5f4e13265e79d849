# A pinned file from PyPI in the dependency cache (SALA_DEPS_DIR, default ~/.cache/sala-deps),
# checked by sha256; when it is missing or wrong, SCRIPT (a scripts/fetch_*.sh wrapper of
# scripts/fetch_pypi_file.sh) fetches it at configure time. Used by cmake/xgrammar.cmake and
# cmake/cutlass.cmake.
if(DEFINED ENV{SALA_DEPS_DIR})
  set(_sala_deps_default "$ENV{SALA_DEPS_DIR}")
else()
  set(_sala_deps_default "$ENV{HOME}/.cache/sala-deps")
endif()
set(SALA_DEPS_DIR "${_sala_deps_default}" CACHE PATH "Where downloaded source packages are kept")

function(_sala_file_sha_ok file sha out)
  set(${out} FALSE PARENT_SCOPE)
  if(EXISTS "${file}")
    file(SHA256 "${file}" h)
    if(h STREQUAL sha)
      set(${out} TRUE PARENT_SCOPE)
    endif()
  endif()
endfunction()

# sala_pypi_file(NAME SHA256 SCRIPT): ${SALA_DEPS_DIR}/NAME exists with that checksum
# afterwards, or configuring fails naming the file and the script.
function(sala_pypi_file name sha script)
  set(file "${SALA_DEPS_DIR}/${name}")
  _sala_file_sha_ok("${file}" "${sha}" ok)
  if(NOT ok)
    message(STATUS "${name}: fetching it from PyPI into ${SALA_DEPS_DIR}")
    execute_process(COMMAND bash "${SALA_SOURCE_DIR}/${script}" "${SALA_DEPS_DIR}"
                    RESULT_VARIABLE rc OUTPUT_QUIET)
    _sala_file_sha_ok("${file}" "${sha}" ok)
    if(NOT rc EQUAL 0 OR NOT ok)
      message(FATAL_ERROR "${name} (sha256 ${sha}) is not in ${SALA_DEPS_DIR} and ${script} "
                          "could not fetch it (it needs PyPI and python3-venv; "
                          "scripts/install_deps.sh installs both)")
    endif()
  endif()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${file}")
endfunction()
