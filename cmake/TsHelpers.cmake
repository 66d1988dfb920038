# Helpers that keep every folder's CMakeLists.txt short and uniform.
#
#   ts_add_library(NAME [CUDA] SRCS ... [DEPS ...] [PRIVATE_DEPS ...])
#     A static library with the repository root on its include path, our warning flags, and its
#     own dependency list (PUBLIC DEPS, PRIVATE_DEPS). Header-only when SRCS is empty.
#   ts_add_executable(NAME SRCS ... [DEPS ...])
#     A binary in ${CMAKE_BINARY_DIR}/bin.
#   ts_add_test(NAME SRCS ... [DEPS ...] LABELS unit|integration|gpu|slow [...] [ARGS ...]
#               [TIMEOUT s])
#     A GoogleTest binary in ${CMAKE_BINARY_DIR}/bin, registered with CTest under its labels.
include_guard(GLOBAL)

set(TS_TEST_LABELS unit integration gpu slow)

# Our own code builds with warnings as errors; third-party headers come in as SYSTEM.
function(ts_target_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror,-Wno-unused-parameter>)
endfunction()

function(ts_add_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  if(ARG_SRCS)
    add_library(${name} STATIC ${ARG_SRCS})
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
    target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
    set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    ts_target_warnings(${name})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR})
    target_link_libraries(${name} INTERFACE ${ARG_DEPS})
  endif()
endfunction()

function(ts_add_executable name)
  cmake_parse_arguments(ARG "" "OUTPUT_NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
  if(ARG_OUTPUT_NAME)
    set_target_properties(${name} PROPERTIES OUTPUT_NAME ${ARG_OUTPUT_NAME})
  endif()
  ts_target_warnings(${name})
endfunction()

function(ts_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SRCS;DEPS;LABELS;ARGS" ${ARGN})
  if(NOT ARG_LABELS)
    message(FATAL_ERROR "ts_add_test(${name}): LABELS is required (one of ${TS_TEST_LABELS})")
  endif()
  foreach(label IN LISTS ARG_LABELS)
    if(NOT label IN_LIST TS_TEST_LABELS)
      message(FATAL_ERROR "ts_add_test(${name}): unknown label '${label}' (use ${TS_TEST_LABELS})")
    endif()
  endforeach()
  ts_add_executable(${name} SRCS ${ARG_SRCS} DEPS ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name} ${ARG_ARGS} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  # Tests share 2 cores under `ctest -j 2`: OpenMP threads that spin while waiting would steal
  # them from each other, so waiting threads sleep.
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "TS_SOURCE_DIR=${PROJECT_SOURCE_DIR};TS_BINARY_DIR=${PROJECT_BINARY_DIR};OMP_WAIT_POLICY=PASSIVE")
endfunction()
