# cuda.h for the driver API. graphd loads libcuda at run time and links
# nothing of CUDA, so a build needs only the declarations, taken from the
# first of:
#   1. GRAPHD_CUDA_INCLUDE (cache or environment): a directory with cuda.h;
#   2. a CUDA 13 toolkit (find_package(CUDAToolkit));
#   3. NVIDIA's nvidia-cuda-runtime wheel: in the Python package's build, the
#      copy pip installed as a build requirement (client/python/pyproject.toml);
#      else downloaded by scripts/fetch-cuda-headers.sh into <build>/cuda-include.
# nvcc, which builds graphd's own kernels and the test kernels, comes only
# from a CUDA 13 toolkit; without one those kernels are left out.
# Sets GRAPHD_CUDA_INCLUDE, GRAPHD_NVCC (empty without nvcc) and the
# interface target graphd_cuda_headers.

set(GRAPHD_CUDA_INCLUDE "$ENV{GRAPHD_CUDA_INCLUDE}" CACHE PATH
  "Directory holding cuda.h (empty: a CUDA 13 toolkit's, else NVIDIA's nvidia-cuda-runtime wheel's)")
set(GRAPHD_NVCC "")
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND AND CUDAToolkit_VERSION VERSION_LESS 13)
  message(STATUS "CUDA toolkit ${CUDAToolkit_VERSION} found (${CUDAToolkit_BIN_DIR}) but graphd "
                 "needs CUDA 13: its headers and nvcc are not used")
elseif(CUDAToolkit_FOUND)
  foreach(_dir ${CUDAToolkit_INCLUDE_DIRS})
    if(NOT GRAPHD_CUDA_INCLUDE AND EXISTS "${_dir}/cuda.h")
      set(GRAPHD_CUDA_INCLUDE ${_dir})
    endif()
  endforeach()
  if(EXISTS "${CUDAToolkit_BIN_DIR}/nvcc")
    set(GRAPHD_NVCC "${CUDAToolkit_BIN_DIR}/nvcc")
  endif()
endif()

if(NOT GRAPHD_CUDA_INCLUDE AND SKBUILD)
  # The Python package's build: pip installed the wheel beside the build.
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c
      "import nvidia.cu13, os; print(next(p for p in nvidia.cu13.__path__ if os.path.exists(os.path.join(p, 'include', 'cuda.h'))) + '/include')"
      OUTPUT_VARIABLE _inc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
    if(_rc EQUAL 0 AND EXISTS "${_inc}/cuda.h")
      set(GRAPHD_CUDA_INCLUDE ${_inc})
    endif()
  endif()
endif()

if(NOT GRAPHD_CUDA_INCLUDE)
  set(_dir ${CMAKE_BINARY_DIR}/cuda-include)
  if(Python3_EXECUTABLE)
    set(_env ${CMAKE_COMMAND} -E env GRAPHD_PYTHON=${Python3_EXECUTABLE})
  else()
    set(_env "")
  endif()
  message(STATUS "No CUDA 13 toolkit: cuda.h from NVIDIA's nvidia-cuda-runtime wheel (scripts/fetch-cuda-headers.sh)")
  execute_process(COMMAND ${_env} ${PROJECT_SOURCE_DIR}/scripts/fetch-cuda-headers.sh ${_dir}
    RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "No cuda.h: no CUDA 13 toolkit was found and scripts/fetch-cuda-headers.sh "
      "could not download NVIDIA's nvidia-cuda-runtime wheel (messages above). Install pip "
      "(Debian: python3-pip) or the CUDA 13 toolkit (CUDAToolkit_ROOT=...), or set "
      "GRAPHD_CUDA_INCLUDE to a directory holding CUDA 13's cuda.h.")
  endif()
  set(GRAPHD_CUDA_INCLUDE ${_dir})
endif()

if(NOT EXISTS "${GRAPHD_CUDA_INCLUDE}/cuda.h")
  message(FATAL_ERROR "GRAPHD_CUDA_INCLUDE=${GRAPHD_CUDA_INCLUDE} holds no cuda.h")
endif()
file(STRINGS "${GRAPHD_CUDA_INCLUDE}/cuda.h" _ver REGEX "^#define CUDA_VERSION [0-9]+")
string(REGEX REPLACE "[^0-9]" "" _ver "${_ver}")
if(NOT _ver OR _ver LESS 13000)
  message(FATAL_ERROR "${GRAPHD_CUDA_INCLUDE}/cuda.h is CUDA_VERSION ${_ver}: graphd needs CUDA 13")
endif()
message(STATUS "CUDA headers: ${GRAPHD_CUDA_INCLUDE} (CUDA_VERSION ${_ver})")

add_library(graphd_cuda_headers INTERFACE)
target_include_directories(graphd_cuda_headers SYSTEM INTERFACE ${GRAPHD_CUDA_INCLUDE})
