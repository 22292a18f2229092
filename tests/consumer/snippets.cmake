# The C++ blocks of README.md and docs/*.md, built as a user builds them (against the installed
# package, no precompiled header). The line right before a block's fence says what it is:
#
#   (nothing)                  a complete translation unit: compiled alone, with exactly the
#                              includes it shows; linked and run when it has a main (must exit 0)
#   <!-- given: PARAMS -->     statements: the body of `int f(PARAMS)` (PARAMS may be empty).
#                              All such blocks share one translation unit (LibTorch's headers cost
#                              ~30 s each), after `#include <baton/baton.hpp>`, `using namespace
#                              baton::literals;` and the includes the blocks show; it is linked,
#                              not run (the parameters have no values)
#   <!-- excerpt: PATH -->     appears verbatim in PATH (relative to the repository), which is
#                              built elsewhere
#   <!-- fragment: WHY -->     not compiled: a synopsis of a declaration, pseudo-code
#
# The generated sources carry #line directives, so the compiler names the Markdown file and line.
# doc_snippets_manifest.cmake tells check.cmake where each block is and which programs to run.

# Lines of a file as a CMake list, with the characters lists cannot hold replaced (restored by
# _doc_line).
function(_doc_lines path out)
  file(READ "${path}" text)
  string(REPLACE "\\" "<doc:bs>" text "${text}")
  string(REPLACE ";" "<doc:sc>" text "${text}")
  string(REPLACE "[" "<doc:lb>" text "${text}")
  string(REPLACE "]" "<doc:rb>" text "${text}")
  string(REPLACE "\n" ";" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

function(_doc_line in out)
  string(REPLACE "<doc:bs>" "\\" s "${in}")
  string(REPLACE "<doc:sc>" ";" s "${s}")
  string(REPLACE "<doc:lb>" "[" s "${s}")
  string(REPLACE "<doc:rb>" "]" s "${s}")
  set(${out} "${s}" PARENT_SCOPE)
endfunction()

# Creates the targets for every C++ block under `root` (README.md, docs/*.md); they link `libs`.
function(baton_doc_snippets root)
  set(libs ${ARGN})
  set(gen "${CMAKE_BINARY_DIR}/doc_snippets")
  file(REMOVE_RECURSE "${gen}")
  file(GLOB docs RELATIVE "${root}" "${root}/docs/*.md")
  list(SORT docs)
  set(given_head "#include <baton/baton.hpp>\n")
  set(given_body "")
  set(manifest "")
  set(runs "")
  set(counts_complete 0)
  set(counts_given 0)
  set(counts_excerpt 0)
  set(counts_fragment 0)
  foreach(rel README.md ${docs})
    _doc_lines("${root}/${rel}" lines)
    set(n 0)           # the current line's number
    set(fence "")      # "" outside a fence, else "in"
    set(prev "")
    foreach(raw IN LISTS lines)
      math(EXPR n "${n} + 1")
      _doc_line("${raw}" line)
      if(fence STREQUAL "")
        if(line MATCHES "^( *)```(.*)$")
          set(indent "${CMAKE_MATCH_1}")
          string(LENGTH "${indent}" indent_len)
          set(fence "in")
          set(first ${n})
          set(body "")
          string(STRIP "${CMAKE_MATCH_2}" info)
          set(is_cpp FALSE)
          if(info MATCHES "^cpp( |$)")
            set(is_cpp TRUE)
            string(STRIP "${prev}" marker)
            math(EXPR marker_line "${n} - 1")
          endif()
        endif()
        set(prev "${line}")
        continue()
      endif()
      if(NOT line MATCHES "^ *```[ ]*$")
        if(is_cpp)
          list(APPEND body "${raw}")   # still escaped: a list element
        endif()
        continue()
      endif()
      set(fence "")
      set(prev "${line}")
      if(NOT is_cpp)
        continue()
      endif()
      math(EXPR start "${first} + 1")
      set(where "${rel}:${first}")
      # The block's text, indentation removed, and its #include lines.
      set(text "")
      set(code "")
      set(includes "")
      set(k ${start})
      foreach(raw IN LISTS body)
        _doc_line("${raw}" l)
        if(indent_len GREATER 0 AND l MATCHES "^${indent}")
          string(SUBSTRING "${l}" ${indent_len} -1 l)
        endif()
        string(APPEND text "${l}\n")
        if(l MATCHES "^[ ]*#[ ]*include")
          string(APPEND includes "#line ${k} \"${rel}\"\n${l}\n")
          string(APPEND code "\n")   # keeps the lines below where the Markdown has them
        else()
          string(APPEND code "${l}\n")
        endif()
        math(EXPR k "${k} + 1")
      endforeach()
      string(MAKE_C_IDENTIFIER "doc_${rel}_${first}" name)
      list(APPEND manifest "${name}|${rel}|${marker_line}|${n}")

      if(marker MATCHES "^<!--[ ]*fragment:[ ]*([^ ].*)-->$")
        math(EXPR counts_fragment "${counts_fragment} + 1")
      elseif(marker MATCHES "^<!--[ ]*excerpt:[ ]*([^ ]+)[ ]*-->$")
        set(source "${CMAKE_MATCH_1}")
        if(NOT EXISTS "${root}/${source}")
          message(FATAL_ERROR "${rel}:${marker_line}: the block is marked as an excerpt of ${source}, which does not exist")
        endif()
        file(READ "${root}/${source}" whole)
        string(FIND "${whole}" "${text}" at)
        if(at EQUAL -1)
          message(FATAL_ERROR "${where}: the C++ block is marked as an excerpt of ${source} but is not in it "
                              "word for word: copy the code from ${source} again (or mark the block otherwise)")
        endif()
        math(EXPR counts_excerpt "${counts_excerpt} + 1")
      elseif(marker MATCHES "^<!--[ ]*given:(.*)-->$")
        string(STRIP "${CMAKE_MATCH_1}" params)
        string(APPEND given_head "${includes}")
        string(APPEND given_body "namespace ${name} {\n#line ${marker_line} \"${rel}\"\nint snippet(${params}) {\n"
                                 "#line ${start} \"${rel}\"\n${code}#line ${n} \"${rel}\"\nreturn 0; }\n}\n")
        math(EXPR counts_given "${counts_given} + 1")
      elseif(marker MATCHES "^<!--")
        message(FATAL_ERROR "${rel}:${marker_line}: an HTML comment right before a C++ block must be one of "
                            "<!-- given: PARAMS -->, <!-- excerpt: PATH -->, <!-- fragment: WHY --> "
                            "(tests/consumer/snippets.cmake), not: ${marker}")
      else()
        # A complete translation unit: exactly what the block shows.
        file(WRITE "${gen}/${name}.cpp" "#line ${start} \"${rel}\"\n${text}")
        if(text MATCHES "(^|\n)[ ]*int[ ]+main[ ]*\\(")
          add_executable(${name} "${gen}/${name}.cpp")
          list(APPEND runs "${name}|${where}")
        else()
          add_library(${name} OBJECT "${gen}/${name}.cpp")
        endif()
        target_link_libraries(${name} PRIVATE ${libs})
        math(EXPR counts_complete "${counts_complete} + 1")
      endif()
    endforeach()
    if(NOT fence STREQUAL "")
      message(FATAL_ERROR "${rel}:${first}: a fence that is never closed")
    endif()
  endforeach()

  if(NOT given_body STREQUAL "")
    # Diagnostics outside the blocks name the generated file and its own lines.
    string(REGEX MATCHALL "\n" newlines "${given_head}")
    list(LENGTH newlines at)
    math(EXPR at "${at} + 2")
    file(WRITE "${gen}/doc_given.cpp" "${given_head}#line ${at} \"${gen}/doc_given.cpp\"\n"
                                      "using namespace baton::literals;\n${given_body}int main() {}\n")
    add_executable(doc_given "${gen}/doc_given.cpp")
    target_link_libraries(doc_given PRIVATE ${libs})
  endif()
  list(JOIN manifest "\" \"" manifest)
  list(JOIN runs "\" \"" runs)
  file(WRITE "${gen}/manifest.cmake" "set(doc_blocks \"${manifest}\")\nset(doc_runs \"${runs}\")\n")
  message(STATUS "C++ blocks of the docs: ${counts_complete} complete, ${counts_given} given a context "
                 "(one translation unit), ${counts_excerpt} excerpts, ${counts_fragment} fragments")
endfunction()
