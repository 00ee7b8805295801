# flash_ladder_add_rung(<NN_name> CPU <sources...> [CUDA <sources...>] [USES <earlier rungs...>])
#
# The one line a rung's CMakeLists.txt holds. It makes an OBJECT library named like the rung's
# directory (so `cmake --build build --target 00_naive_eigen` builds that rung alone), leaves the
# CUDA sources out when there is no nvcc, and records the rung in a global list that the ladder,
# the benchmarks, the C ABI and the tests read. OBJECT libraries keep every object file, so the
# self-registering static objects in each source are never dropped by the linker.
# USES names earlier rungs whose stages this one calls (rung 01 reuses rung 00's matmuls); whatever
# links this rung alone links those too (flash_ladder_link_rung).
function(flash_ladder_add_rung name)
  cmake_parse_arguments(R "" "" "CPU;CUDA;USES" ${ARGN})
  set(_srcs ${R_CPU})
  if(FLASH_LADDER_HAS_CUDA)
    list(APPEND _srcs ${R_CUDA})
  endif()
  add_library(${name} OBJECT ${_srcs})
  target_link_libraries(${name} PUBLIC flash_ladder_common)
  target_include_directories(${name} PUBLIC "${CMAKE_CURRENT_SOURCE_DIR}")
  set_property(GLOBAL APPEND PROPERTY FLASH_LADDER_RUNGS ${name})
  set_property(GLOBAL PROPERTY FLASH_LADDER_USES_${name} ${R_USES})
endfunction()

# The rung and, recursively, the rungs it USES.
function(flash_ladder_rung_closure out name)
  set(_all ${name})
  get_property(_uses GLOBAL PROPERTY FLASH_LADDER_USES_${name})
  foreach(_u IN LISTS _uses)
    flash_ladder_rung_closure(_sub ${_u})
    list(APPEND _all ${_sub})
  endforeach()
  list(REMOVE_DUPLICATES _all)
  set(${out} ${_all} PARENT_SCOPE)
endfunction()

# Links one rung (and what it uses) into <target>: a rung's own test links only this.
function(flash_ladder_link_rung target name)
  flash_ladder_rung_closure(_rungs ${name})
  target_link_libraries(${target} PRIVATE ${_rungs})
endfunction()

# Links every registered rung into <target> (ladder, benchmarks, C ABI).
function(flash_ladder_link_all_rungs target)
  get_property(_rungs GLOBAL PROPERTY FLASH_LADDER_RUNGS)
  target_link_libraries(${target} PRIVATE ${_rungs})
endfunction()
