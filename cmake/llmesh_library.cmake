# llmesh_add_library(<folder> [SOURCES ...] [DEPS ...] [PRIVATE_DEPS ...])
#
# The one way a source folder becomes a library: target `llmesh_<folder>`, public headers
# under `<folder>/include/llmesh/<folder>/`, everything else private. A folder without
# sources becomes a header-only INTERFACE target.
function(llmesh_add_library folder)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  set(target llmesh_${folder})
  if(ARG_SOURCES)
    add_library(${target} STATIC ${ARG_SOURCES})
    target_include_directories(${target} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
                                         PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
    target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${CMAKE_CURRENT_SOURCE_DIR}/include)
    target_link_libraries(${target} INTERFACE ${ARG_DEPS})
  endif()
  add_library(llmesh::${folder} ALIAS ${target})
endfunction()

# llmesh_add_test(<name> SOURCES ... DEPS ... [LABELS ...])
function(llmesh_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  # Every test has a time limit: a hang fails that test by name instead of holding CI until its
  # own limit. ctest also waits for a test's children when they hold its output; with a TIMEOUT
  # such a leaked child fails the test at the limit instead of blocking the run forever.
  # Why 180 s: the slowest test takes ~11 s on 2 idle cores; CI runs two at a time.
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT 180)
endfunction()
