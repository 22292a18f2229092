# Every data member of a public header has a default initializer, so a user who writes
# `baton::data::synthetic({.samples = 500})` with -Wextra gets no missing-field-initializers
# warning (GCC warns for each member without one, std::string and std::optional included).
# Fails naming each declaration without one. References and private members (name_) are exempt.
# Usage: cmake -DINCLUDE_DIR=<repo>/include -P member_defaults.cmake
file(GLOB headers "${INCLUDE_DIR}/baton/*.hpp")
set(bad "")
foreach(header ${headers})
  file(READ "${header}" text)
  string(REPLACE ";" "<semi>" text "${text}")
  string(REGEX MATCHALL "[^\n]*\n" lines "${text}")
  set(n 0)
  foreach(line IN LISTS lines)
    math(EXPR n "${n} + 1")
    # A declaration: indented, a type (templates, function types), names, then ';' and at most a comment.
    if(NOT line MATCHES "^ +(const )?[A-Za-z_][A-Za-z0-9_:<>, *()]*[A-Za-z0-9_>)*] +[a-z_][a-z0-9_]*( *, *[a-z_][a-z0-9_]*)*<semi> *(//[^\n]*)?\n$")
      continue()
    endif()
    if(line MATCHES "(^| )(return|using|friend|typedef|struct|class|enum|break|continue|delete|throw|goto) " OR
       line MATCHES "&" OR line MATCHES "_<semi>" OR line MATCHES "^ +[a-z_][a-z0-9_]* +[a-z_]")
      continue()
    endif()
    get_filename_component(name "${header}" NAME)
    string(REPLACE "<semi>" ";" line "${line}")
    string(STRIP "${line}" line)
    string(APPEND bad "\n  ${name}:${n}: ${line}")
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "public members without a default initializer (add {} or = value):${bad}")
endif()
message(STATUS "every data member of the public headers has a default initializer")
