#pragma once
// What interop.cpp and pt_reader.cpp share.
#include <filesystem>
#include <memory>
#include <string_view>

#include <caffe2/serialize/inline_container.h>

#include "baton/interop.hpp"

namespace baton::detail {
/// A zip archive as torch.save writes it, opened, with every record checked against its CRC-32
/// and sizes (a damaged file is an error naming the record); `what` names what it should be in the error.
Expected<std::unique_ptr<caffe2::serialize::PyTorchStreamReader>> open_archive(const std::filesystem::path& file,
                                                                                std::string_view what);
/// The tensors by name of a file torch.save wrote (pt_reader.cpp).
Expected<StateDict> read_torch_save(const std::filesystem::path& file);
}  // namespace baton::detail
