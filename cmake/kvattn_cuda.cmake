# The CUDA backend (included by the top-level CMakeLists.txt when KVATTN_WITH_CUDA is ON).
# Plain C++ against the CUDA runtime API and NVRTC: no .cu files, no nvcc, no libcuda link
# (cudart_static loads the driver lazily, so the library loads and its CPU paths work without one).
file(GLOB KVATTN_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/*.cpp)
file(GLOB_RECURSE KVATTN_KERNEL_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/kernels/*.cuh)
set(KVATTN_EMBEDDED_CPP ${PROJECT_BINARY_DIR}/generated/kvattn_embedded_kernels.cpp)
add_custom_command(
  OUTPUT ${KVATTN_EMBEDDED_CPP}
  COMMAND ${CMAKE_COMMAND} -DSRC_DIR=${PROJECT_SOURCE_DIR}/src -DOUTPUT=${KVATTN_EMBEDDED_CPP}
          -P ${PROJECT_SOURCE_DIR}/cmake/embed_kernels.cmake
  DEPENDS ${KVATTN_KERNEL_HEADERS} ${PROJECT_SOURCE_DIR}/cmake/embed_kernels.cmake
  COMMENT "Embedding src/kernels/*.cuh for the NVRTC JIT"
  VERBATIM)
target_sources(kvattn PRIVATE ${KVATTN_CUDA_SOURCES} ${KVATTN_EMBEDDED_CPP})
# Not CUDA::nvrtc: CMake (3.25 at least) gives it a dependency on CUDA::cuda_driver, the libcuda
# stub, whose DT_NEEDED libcuda.so.1 would stop every kvattn binary from starting on a machine
# without a driver. libnvrtc itself needs no driver. kvattnConfig.cmake defines the same target.
if(NOT TARGET kvattn::nvrtc)
  add_library(kvattn::nvrtc SHARED IMPORTED)
  set_target_properties(kvattn::nvrtc PROPERTIES IMPORTED_LOCATION "${CUDA_nvrtc_LIBRARY}")
endif()
target_link_libraries(kvattn PRIVATE CUDA::cudart_static kvattn::nvrtc)
# Tests and apps in this build see it; the installed public headers do not depend on it.
target_compile_definitions(kvattn PUBLIC $<BUILD_INTERFACE:KVATTN_WITH_CUDA=1>)
