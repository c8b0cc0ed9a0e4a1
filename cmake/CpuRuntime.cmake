# How sorl's executables run on the CPU: which BLAS build Debian's libtorch calls, and which
# malloc. Both were chosen by measurement (docs/decode-speed.md, "The CPU runtime"): on the
# 2-core reference machine the real model's learner step went from 14.2 s to 9.6 s with the
# two together, and its peak RSS fell by about 650 MiB.
#
# sorl_cpu_runtime() sets, for every executable defined after it:
#  - an RPATH to OpenBLAS's OpenMP build. Debian's libtorch needs libblas.so.3, which the
#    system's alternatives point at OpenBLAS's pthread build. That build keeps its own thread
#    pool beside libtorch's OpenMP pool, and on a small machine the two pools take turns
#    spinning (a fifth of a learner step went to sched_yield and libgomp's spin loop). The
#    OpenMP build shares libgomp's pool. A DT_RPATH (not a RUNPATH) is what the loader
#    consults for libtorch's own dependencies, so the system's alternatives stay untouched.
#  - a link to tcmalloc (gperftools' minimal build). glibc returns large freed blocks to the
#    kernel, so every step faults in and zeroes fresh pages for its activations (clear_page
#    was a tenth of a step); tcmalloc keeps them.
# Each is skipped with a status line when its library is missing, or turned off with
# -DSORL_OPENMP_BLAS=OFF / -DSORL_TCMALLOC=OFF. Builds against a PyPI libtorch (which brings
# its own BLAS) skip the first.
option(SORL_OPENMP_BLAS "Run Debian's libtorch on OpenBLAS's OpenMP build" ON)
option(SORL_TCMALLOC "Link the executables with tcmalloc" ON)

function(sorl_cpu_runtime)
  set(arch_dir "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}")
  set(openmp_blas "${arch_dir}/openblas-openmp")
  get_filename_component(torch_dir "${TORCH_LIBRARY}" DIRECTORY)
  if(SORL_OPENMP_BLAS AND torch_dir STREQUAL arch_dir AND EXISTS "${openmp_blas}/libblas.so.3")
    # --disable-new-dtags writes DT_RPATH, which (unlike DT_RUNPATH) also serves the lookups
    # of the executable's dependencies, libtorch_cpu's libblas.so.3 among them.
    set(CMAKE_BUILD_RPATH "${openmp_blas}" PARENT_SCOPE)
    set(CMAKE_INSTALL_RPATH "${openmp_blas}" PARENT_SCOPE)
    add_link_options("LINKER:--disable-new-dtags")
    message(STATUS "sorl: libtorch's BLAS is OpenBLAS's OpenMP build (${openmp_blas})")
  elseif(SORL_OPENMP_BLAS AND torch_dir STREQUAL arch_dir)
    message(STATUS "sorl: OpenBLAS's OpenMP build not found (Debian package libopenblas0-openmp); "
                   "libtorch keeps the system's libblas.so.3")
  endif()
  if(SORL_TCMALLOC)
    find_library(SORL_TCMALLOC_LIBRARY NAMES tcmalloc_minimal libtcmalloc_minimal.so.4)
    if(SORL_TCMALLOC_LIBRARY)
      link_libraries("${SORL_TCMALLOC_LIBRARY}")
      message(STATUS "sorl: malloc is tcmalloc (${SORL_TCMALLOC_LIBRARY})")
    else()
      message(STATUS "sorl: tcmalloc not found (Debian package libtcmalloc-minimal4); malloc is glibc's")
    endif()
  endif()
endfunction()
