# gpu/device_parity: CPU-versus-device parity of the policy, the rollout path and one learner
# step (gpu/check_device.sh runs it). Plain C++ on libtorch, built on every machine so that
# the check runs end to end with device = "cpu" where no GPU is; included by the top-level
# CMakeLists.txt after actors/.
add_executable(device_parity "${CMAKE_CURRENT_LIST_DIR}/device_parity.cpp")
target_link_libraries(device_parity PRIVATE sorl::learner_core sorl::ml_formats sorl_warnings)
set_target_properties(device_parity PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/gpu")
