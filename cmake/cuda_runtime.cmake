# CUDA headers (cuda.h, cuda_runtime_api.h) and the static CUDA runtime
# (libcudart_static.a) for jaxgraph's extensions, as the imported target
# jaxgraph_cudart_static. No CUDA code is compiled at build time (kernels are
# compiled at run time by NVRTC), so no nvcc is needed: only these files.
#
# Where they come from, first match wins:
#   1. CUDAToolkit_ROOT (CMake or environment variable), else CUDA_HOME: that
#      directory and nothing else (an error if it lacks the files).
#   2. NVIDIA's pip wheels nvidia-cuda-runtime and nvidia-cuda-crt in the
#      building Python (site-packages/nvidia/cu13/): build requirements in
#      pyproject.toml; with --no-build-isolation, the environment's own
#      (jax[cuda13] installs them).
#   3. A system toolkit, found by CMake's FindCUDAToolkit (nvcc on PATH,
#      CUDA_PATH, /usr/local/cuda).
#
# The runtime is linked statically: it opens libcuda only at the first CUDA
# call, so the extensions load on machines without an NVIDIA driver.

# string(CONCAT) keeps the semicolons that a list would eat.
string(CONCAT _cuda_where
  "jaxgraph needs CUDA's headers (cuda.h) and static runtime (libcudart_static.a), no nvcc, "
  "and takes them from, in order: CUDAToolkit_ROOT or CUDA_HOME; NVIDIA's pip wheels in the "
  "building Python (${Python_EXECUTABLE} -m pip install \"nvidia-cuda-runtime>=13.0,<14\" "
  "\"nvidia-cuda-crt>=13.0,<14\", or install without --no-build-isolation, which fetches them); "
  "a CUDA toolkit found by CMake's FindCUDAToolkit (nvcc on PATH, CUDA_PATH, /usr/local/cuda). "
  "The docs' Troubleshooting page (docs/troubleshooting.md) gives each build error's fix.")

# Sets <prefix>_INCLUDE and <prefix>_LIBRARY when `root` holds every file the
# build needs, else <prefix>_MISSING to what it lacks.
function(_jaxgraph_cuda_in root prefix)
  unset(${prefix}_INCLUDE PARENT_SCOPE)
  unset(${prefix}_LIBRARY PARENT_SCOPE)
  set(missing "")
  # crt/ comes from the nvidia-cuda-crt wheel where the headers are wheels.
  foreach(header cuda.h cuda_runtime_api.h crt/host_defines.h)
    if(NOT EXISTS "${root}/include/${header}")
      list(APPEND missing "include/${header}")
    endif()
  endforeach()
  set(library "")
  foreach(dir lib64 lib "targets/${CMAKE_SYSTEM_PROCESSOR}-linux/lib")
    if(NOT library AND EXISTS "${root}/${dir}/libcudart_static.a")
      set(library "${root}/${dir}/libcudart_static.a")
    endif()
  endforeach()
  if(NOT library)
    list(APPEND missing "lib/libcudart_static.a")
  endif()
  if(missing)
    list(JOIN missing ", " missing)
    set(${prefix}_MISSING "${missing}" PARENT_SCOPE)
  else()
    set(${prefix}_INCLUDE "${root}/include" PARENT_SCOPE)
    set(${prefix}_LIBRARY "${library}" PARENT_SCOPE)
  endif()
endfunction()

unset(_cuda_INCLUDE)
set(_cuda_wheel_note "")
# 1. An explicit root.
if(DEFINED CUDAToolkit_ROOT)
  set(_cuda_root "${CUDAToolkit_ROOT}")
  set(_cuda_route "CUDAToolkit_ROOT")
elseif(DEFINED ENV{CUDAToolkit_ROOT})
  set(_cuda_root "$ENV{CUDAToolkit_ROOT}")
  set(_cuda_route "CUDAToolkit_ROOT")
elseif(DEFINED ENV{CUDA_HOME})
  set(_cuda_root "$ENV{CUDA_HOME}")
  set(_cuda_route "CUDA_HOME")
endif()
if(DEFINED _cuda_route)
  _jaxgraph_cuda_in("${_cuda_root}" _cuda)
  if(NOT DEFINED _cuda_INCLUDE)
    message(FATAL_ERROR
      "jaxgraph: ${_cuda_route}=${_cuda_root} lacks ${_cuda_MISSING}; point it at a CUDA "
      "toolkit or at NVIDIA's wheel directory (site-packages/nvidia/cu13), or unset it. "
      "${_cuda_where}")
  endif()
endif()

# 2. NVIDIA's wheel, wherever the building Python finds packages.
if(NOT DEFINED _cuda_INCLUDE)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, sys\nfor p in sys.path:\n    d = os.path.join(p or '.', 'nvidia', 'cu13')\n    if os.path.isfile(os.path.join(d, 'include', 'cuda.h')):\n        print(os.path.abspath(d)); break"
    OUTPUT_STRIP_TRAILING_WHITESPACE OUTPUT_VARIABLE _cuda_root)
  if(_cuda_root)
    _jaxgraph_cuda_in("${_cuda_root}" _cuda)
    set(_cuda_route "NVIDIA's pip wheels")
    if(_cuda_MISSING)
      # A wheel set without crt/ (nvidia-cuda-crt) or the runtime: say so if
      # no system toolkit saves the build.
      string(CONCAT _cuda_wheel_note " NVIDIA's wheels in ${_cuda_root} lack ${_cuda_MISSING} "
             "(pip install \"nvidia-cuda-runtime>=13.0,<14\" \"nvidia-cuda-crt>=13.0,<14\").")
    endif()
  endif()
endif()

# 3. A system toolkit.
if(NOT DEFINED _cuda_INCLUDE)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND CUDA_cudart_static_LIBRARY)
    list(GET CUDAToolkit_INCLUDE_DIRS 0 _cuda_INCLUDE)
    set(_cuda_LIBRARY "${CUDA_cudart_static_LIBRARY}")
    set(_cuda_route "system toolkit")
  endif()
endif()

if(NOT DEFINED _cuda_INCLUDE)
  message(FATAL_ERROR
    "jaxgraph: found no CUDA headers and static runtime.${_cuda_wheel_note} ${_cuda_where}")
endif()

file(STRINGS "${_cuda_INCLUDE}/cuda.h" _cuda_version_line REGEX "^#define CUDA_VERSION [0-9]+")
string(REGEX REPLACE "^#define CUDA_VERSION ([0-9]+).*" "\\1" _cuda_version "${_cuda_version_line}")
if(NOT _cuda_version OR _cuda_version LESS 12050)
  # cudaGetDriverEntryPointByVersion (ffi/common.h) is CUDA 12.5's.
  message(FATAL_ERROR
    "jaxgraph: the CUDA headers in ${_cuda_INCLUDE} are version ${_cuda_version}; "
    "jaxgraph needs CUDA 12.5 or newer. ${_cuda_where}")
endif()
math(EXPR _cuda_major "${_cuda_version} / 1000")
math(EXPR _cuda_minor "${_cuda_version} % 1000 / 10")
message(STATUS "jaxgraph: CUDA ${_cuda_major}.${_cuda_minor} headers and static runtime from "
               "${_cuda_route}: ${_cuda_INCLUDE}, ${_cuda_LIBRARY}")

find_package(Threads REQUIRED)
add_library(jaxgraph_cudart_static STATIC IMPORTED)
set_target_properties(jaxgraph_cudart_static PROPERTIES
  IMPORTED_LOCATION "${_cuda_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${_cuda_INCLUDE}"
  # What libcudart_static.a itself needs (as FindCUDAToolkit's CUDA::cudart_static).
  INTERFACE_LINK_LIBRARIES "Threads::Threads;${CMAKE_DL_LIBS};rt")
