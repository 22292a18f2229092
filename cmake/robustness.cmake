# Sanitizer and fuzzing builds (docs/sanitizers.md, docs/fuzzing.md). Included after LibTorch is
# found and before any target, so the flags below reach every target of baton's own code; LibTorch
# and the other system libraries are used as installed (not instrumented).
option(BATON_SANITIZE "Build baton, its tests and programs with AddressSanitizer + UndefinedBehaviorSanitizer" OFF)
option(BATON_FUZZ "Build the libFuzzer targets in fuzz/ (clang only; use its own build directory)" OFF)

if(BATON_SANITIZE OR BATON_FUZZ)
  # UB stops the program (a test or fuzz run fails) instead of printing and going on.
  add_compile_options(-fno-omit-frame-pointer -fno-sanitize-recover=undefined -g1)
endif()

if(BATON_SANITIZE)
  add_compile_options(-fsanitize=address,undefined)
  add_link_options(-fsanitize=address,undefined)
  # GCC 12 with -fsanitize=address warns "may be used uninitialized" inside libstdc++'s own
  # <regex> (std::function in _StateT); a false positive in the system headers, not baton's code.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
endif()

if(BATON_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "BATON_FUZZ needs clang (libFuzzer): configure a separate build directory with "
                        "-DCMAKE_CXX_COMPILER=clang++-14")
  endif()
  # The library is instrumented for coverage; only the fuzz targets link libFuzzer's main.
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined)
  add_link_options(-fsanitize=address,undefined)
  include(${CMAKE_CURRENT_LIST_DIR}/clang_libtorch_compat.cmake)
endif()

# In every build: toml++'s headers without its UB on non-ASCII input (see the file).
include(${CMAKE_CURRENT_LIST_DIR}/toml_compat.cmake)
