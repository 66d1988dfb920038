# CUDA and NCCL detection.
#   TS_ENABLE_CUDA = AUTO (default: on when nvcc is found, /usr/local/cuda included) | ON | OFF
#   TS_CUDA_ARCHS  = "80;90" by default (A100 and H100/H200)
# Sets TS_HAVE_CUDA and TS_HAVE_NCCL, and the imported target ts::nccl when NCCL is found.
include_guard(GLOBAL)

set(TS_ENABLE_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE TS_ENABLE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(TS_CUDA_ARCHS "80;90" CACHE STRING "CUDA architectures to build for")

set(TS_HAVE_CUDA OFF)
set(TS_HAVE_NCCL OFF)
string(TOUPPER "${TS_ENABLE_CUDA}" _ts_cuda_mode)
if(NOT _ts_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TS_ENABLE_CUDA must be AUTO, ON or OFF (got '${TS_ENABLE_CUDA}')")
endif()

if(NOT _ts_cuda_mode STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(_ts_nvcc nvcc HINTS $ENV{CUDA_HOME}/bin /usr/local/cuda/bin)
    if(_ts_nvcc)
      set(CMAKE_CUDA_COMPILER "${_ts_nvcc}" CACHE FILEPATH "nvcc" FORCE)
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES "${TS_CUDA_ARCHS}")
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(TS_HAVE_CUDA ON)
  elseif(_ts_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "TS_ENABLE_CUDA=ON but nvcc was not found (looked on PATH, "
                        "$CUDA_HOME/bin and /usr/local/cuda/bin)")
  endif()
endif()

if(TS_HAVE_CUDA)
  find_path(TS_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(TS_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(TS_NCCL_INCLUDE_DIR AND TS_NCCL_LIBRARY)
    add_library(ts::nccl UNKNOWN IMPORTED)
    set_target_properties(ts::nccl PROPERTIES IMPORTED_LOCATION "${TS_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${TS_NCCL_INCLUDE_DIR}")
    set(TS_HAVE_NCCL ON)
  endif()
endif()
message(STATUS "tokenselect: CUDA=${TS_HAVE_CUDA} (archs ${TS_CUDA_ARCHS}) NCCL=${TS_HAVE_NCCL}")
