# A libtorch from a PyPI torch wheel ships, next to its own headers, copies of the headers of
# libraries it bundles (fmt 11, pybind11, oneDNN...) in the same include directory. On the
# include path ahead of /usr/include they would replace Debian's fmt 9 headers, which sorl's
# code and the libfmt / spdlog it links are built for. sorl_curate_torch_headers points the
# torch targets at a directory that holds only libtorch's own headers instead (links into the
# wheel; nothing is copied). Debian's libtorch-dev has no such copies and is left as it is.
# It also fixes the link order for such a libtorch (below).
function(sorl_curate_torch_headers)
  if(NOT TORCH_INSTALL_PREFIX OR NOT EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt")
    return()
  endif()
  set(src "${TORCH_INSTALL_PREFIX}/include")
  set(dst "${CMAKE_BINARY_DIR}/torch-include")
  file(MAKE_DIRECTORY "${dst}")
  foreach(dir ATen c10 caffe2 torch)
    if(EXISTS "${src}/${dir}" AND NOT EXISTS "${dst}/${dir}")
      file(CREATE_LINK "${src}/${dir}" "${dst}/${dir}" SYMBOLIC)
    endif()
  endforeach()
  foreach(target headeronly c10 c10_cuda torch_cpu torch_cuda torch)
    if(NOT TARGET ${target})
      continue()
    endif()
    get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
    if(dirs)
      list(TRANSFORM dirs REPLACE "^${src}$" "${dst}")
      set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${dirs}")
    endif()
  endforeach()
  # The wheel's libtorch.so also exports a copy of libstdc++'s std::filesystem (from the
  # libstdc++ it links statically). Listed ahead of libstdc++ among a binary's needed
  # libraries, it is the copy the dynamic linker binds std::filesystem calls to, and that copy
  # crashes (remove_all jumps through a null pointer). libstdc++ first in every link of this
  # directory and below makes the system's own definitions win.
  add_link_options("SHELL:-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state")
  message(STATUS "sorl: libtorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX}, its own headers only (${dst}); "
                 "libstdc++ linked ahead of it")
endfunction()
