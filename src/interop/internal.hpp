#pragma once
// What interop.cpp and pt_reader.cpp share.
#include <filesystem>

#include "baton/interop.hpp"

namespace baton::detail {
/// The tensors by name of a file torch.save wrote (pt_reader.cpp).
Expected<StateDict> read_torch_save(const std::filesystem::path& file);
}  // namespace baton::detail
