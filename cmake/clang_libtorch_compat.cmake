# clang in C++20 mode cannot compile Debian's LibTorch 1.13 header ATen/core/List.h: it defines
# functions that use std::vector<c10::IValue> (ListImpl's constructor and copy(), and
# impl::ptr_to_first_element) while IValue is still an incomplete type, and C++20's constexpr
# std::vector members are instantiated at that point. GCC accepts it; clang rejects it.
# This writes a copy of the header into the build directory with those three definitions moved
# below the `#include <ATen/core/List_inl.h>` at its end (where IValue is complete) and puts the
# copy first on the include path. The code is the same; only where it is defined changes.
find_file(BATON_TORCH_LIST_H ATen/core/List.h PATHS ${TORCH_INCLUDE_DIRS} /usr/include NO_DEFAULT_PATH)
if(NOT BATON_TORCH_LIST_H)
  message(FATAL_ERROR "clang_libtorch_compat: ATen/core/List.h not found under ${TORCH_INCLUDE_DIRS}")
endif()
file(READ "${BATON_TORCH_LIST_H}" _list_h)

function(_baton_patch from to)
  string(FIND "${_list_h}" "${from}" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "clang_libtorch_compat: ${BATON_TORCH_LIST_H} is not the LibTorch 1.13 header this "
                        "patch expects (text not found: ${from}); build the fuzz targets without it or adapt the patch")
  endif()
  string(REPLACE "${from}" "${to}" _patched "${_list_h}")
  set(_list_h "${_patched}" PARENT_SCOPE)
endfunction()

_baton_patch("  explicit ListImpl(list_type list_, TypePtr elementType_)
  : list(std::move(list_))
  , elementType(std::move(elementType_)) {}
" "  inline explicit ListImpl(list_type list_, TypePtr elementType_);
")
_baton_patch("  intrusive_ptr<ListImpl> copy() const {
    return make_intrusive<ListImpl>(list, elementType);
  }
" "  inline intrusive_ptr<ListImpl> copy() const;
")
_baton_patch("inline const IValue* ptr_to_first_element(const GenericList& list) {
  return &list.impl_->list[0];
}
" "inline const IValue* ptr_to_first_element(const GenericList& list);
")
_baton_patch("#include <ATen/core/List_inl.h>  // IWYU pragma: keep
" "#include <ATen/core/List_inl.h>  // IWYU pragma: keep

// baton (cmake/clang_libtorch_compat.cmake): the definitions moved here, where IValue is complete.
namespace c10 {
namespace detail {
inline ListImpl::ListImpl(list_type list_, TypePtr elementType_)
  : list(std::move(list_)), elementType(std::move(elementType_)) {}
inline intrusive_ptr<ListImpl> ListImpl::copy() const {
  return make_intrusive<ListImpl>(list, elementType);
}
}  // namespace detail
namespace impl {
inline const IValue* ptr_to_first_element(const GenericList& list) {
  return &list.impl_->list[0];
}
}  // namespace impl
}  // namespace c10
")
set(_compat_dir "${CMAKE_BINARY_DIR}/clang-libtorch-compat")
set(_out "${_compat_dir}/ATen/core/List.h")
set(_old "")
if(EXISTS "${_out}")
  file(READ "${_out}" _old)
endif()
if(NOT _old STREQUAL _list_h)  # rewrite only on change: no needless rebuilds
  file(WRITE "${_out}" "${_list_h}")
endif()
include_directories(BEFORE SYSTEM "${_compat_dir}")
