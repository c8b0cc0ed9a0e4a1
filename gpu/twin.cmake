# The plain-C++ half of gpu/: bucket framing and the CPU twin of the kernels. Included by
# gpu/CMakeLists.txt and, when CUDA is absent, by tests/gpu/CMakeLists.txt, so that the twin
# test builds on every machine.
if(NOT TARGET sorl_gpu_twin)
  add_library(sorl_gpu_twin STATIC
    "${PROJECT_SOURCE_DIR}/gpu/delta_framing.cpp"
    "${PROJECT_SOURCE_DIR}/gpu/delta_twin.cpp")
  add_library(sorl::gpu_twin ALIAS sorl_gpu_twin)
  target_include_directories(sorl_gpu_twin PUBLIC "${PROJECT_SOURCE_DIR}")
  target_link_libraries(sorl_gpu_twin PUBLIC sorl::delta_codec fmt::fmt PRIVATE sorl_warnings)
endif()
